/* Every table's sort arrows, operable from the keyboard.
 *
 * Dash's DataTable (sort_action="native") draws each column's sort control as a <span>
 * with a click handler only: no tab stop, no role, no name, so a keyboard user can neither
 * reach nor press it, and a screen reader does not say it is there. This script, loaded
 * with the page's assets, makes each one a button in the tab order, named for its column
 * ("Sort by Instance type"), that Enter and Space press as a click does (the table's own
 * handler sorts: ascending, descending, then unsorted), and sets the header's aria-sort
 * from the arrow the table draws. The table re-renders its headers (a refresh, a sort),
 * so a MutationObserver marks whatever controls appear. Tab moves on out of a table (its
 * own key handling held the focus on its first control or link).
 */
(function () {
  "use strict";
  var SORT = ".column-header--sort";
  // The arrow the table draws (its FontAwesome icon) -> the header's aria-sort.
  var DIRECTION = {"sort-up": "ascending", "sort-down": "descending", "sort": "none"};

  function mark() {
    var controls = document.querySelectorAll(SORT);
    for (var i = 0; i < controls.length; i++) {
      var control = controls[i];
      var header = control.closest("th");
      var name = header && header.querySelector(".column-header-name");
      if (!control.hasAttribute("tabindex")) {
        control.setAttribute("tabindex", "0");
        control.setAttribute("role", "button");
      }
      var label = "Sort by " + (name ? name.textContent.trim() : "this column");
      if (control.getAttribute("aria-label") !== label) {
        control.setAttribute("aria-label", label);
      }
      var icon = control.querySelector("svg");
      var direction = DIRECTION[icon ? icon.getAttribute("data-icon") : "sort"] || "none";
      if (header && header.getAttribute("aria-sort") !== direction) {
        header.setAttribute("aria-sort", direction);
      }
    }
  }

  // Once per frame at most: a page of charts mutates the DOM a great deal.
  var pending = false;
  function schedule() {
    if (!pending) {
      pending = true;
      window.requestAnimationFrame(function () { pending = false; mark(); });
    }
  }

  // Captured before the table's own key handling, which takes Tab (and the arrows) to move
  // its active cell and keeps the browser from moving the focus: Tab from a sort control or
  // a row's link went nowhere, and a keyboard user could not leave the first table. Tab in
  // a table is the browser's (the tables are read-only: no cell to edit), and a key on a
  // sort control is the browser's or ours (Enter, Space), never the table's.
  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) { return; }
    if (target.matches(SORT)) {
      event.stopPropagation();
      if (event.key === "Enter" || event.key === " " || event.key === "Spacebar") {
        event.preventDefault();  // Space would scroll the page
        target.click();  // the table's own onClick: the same sort a mouse click makes
      }
    } else if (event.key === "Tab" && target.closest(".dash-table-container")) {
      event.stopPropagation();
    }
  }, true);

  function start() {
    mark();
    // childList: headers drawn anew; data-icon: the arrow of a header that stays.
    new MutationObserver(schedule).observe(document.body, {
      childList: true, subtree: true, attributes: true, attributeFilter: ["data-icon"],
    });
  }

  if (document.body) { start(); } else { document.addEventListener("DOMContentLoaded", start); }
})();
