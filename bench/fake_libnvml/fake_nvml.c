/*
 * A fake libnvidia-ml for the benchmark: the NVML entry points exporter/sources/nvml/ reaches
 * through pynvml, in C, so that the double's own cost is what a real driver's library costs
 * (native code behind a ctypes call), not Python's.
 *
 * The node is the one bench/nvml_fake_exporter.py's build_node(gpus, ppg) gives FakeNvml
 * (tests/exporter/sources/fake_nvml.py): GPU g is an A100-SXM4-80GB with UUID
 * GPU-00000000-0000-0000-0000-0000a100000<g> (uuid.UUID(int=0xA1000000 + g)), PCI bus ID
 * 00000000:<0x10 + g>:00.0, 80 GiB of memory with 1 GiB used and 615 MiB reserved by the
 * driver (FakeGpu's default memory_reserved; nvmlDeviceGetMemoryInfo_v2 answers them apart,
 * v1's used is total - free, reserved included), utilization 50 % / 20 %,
 * 45 C, 250 W of 400 W, 1e9 mJ, SM 1410 MHz, memory 1593 MHz, fan 30 %, no ECC errors,
 * Ampere, no MIG (MigMode NOT_SUPPORTED), XID events registrable (raised only as
 * FAKE_NVML_XIDS plans them); and
 * ppg compute processes, process i with PID 10000 + g * ppg + i and 72 GiB / ppg bytes,
 * outside any MIG instance. No graphics processes. Driver 550.54.15.
 *
 * Per-process utilization: the driver keeps a buffer of samples, one per process per tick.
 * Here there is no driver thread: the samples are synthesized from CLOCK_REALTIME, one per
 * process at every whole second k (timeStamp k * 1e6 us, smUtil 1 + (i + k) % 3,
 * memUtil i % 2), the last FAKE_NVML_HISTORY_SECONDS seconds of them being "in the buffer".
 * GPU-utilization samples (nvmlDeviceGetSamples) likewise: one per GPU at every whole second,
 * 50 %.
 *
 * Work signals, as build_node sets them on the Python double: GPM supported (as on Hopper) with
 * constant means (SM 40 %, tensor 25 %, DRAM 60 %, graphics 90 %, occupancy 30 %, PCIe rx/tx
 * 100/50 MiB/s, NVLink rx/tx 1000/2000 MiB/s; other metrics NOT_SUPPORTED); perf-policy
 * violation counters (fields 74-81 and nvmlDeviceGetViolationStatus) power 5 s, thermal 2 s,
 * the others 0; clocks-event-reason durations (fields 269-271) SW thermal 2 s, the others 0
 * (until a GPU reset that FAKE_NVML_THROTTLE_RESETS plans: from then on every counter starts
 * again from 0 and the GPU is power-capped all the time, its power counter the time since).
 * GPM sample buffers are malloc'd; a metrics request checks them as the driver does (two
 * filled buffers of one GPU, the older first).
 *
 * Row remapping (nvmlDeviceGetRemappedRows), as the Python double's default FakeGpu: every
 * GPU has a row remapper with no row remapped, no remap pending and none failed, unless
 * FAKE_NVML_REMAPPED_ROWS says otherwise for it.
 *
 * CUDA MPS (FAKE_NVML_MPS): planted servers and clients replace a GPU's synthesized processes,
 * each running from nvmlInit until its optional exit time; both per-process utilization
 * behaviours (FAKE_NVML_MPS_CLIENT_UTILIZATION), as the Python double's FakeProcess.mps and
 * mps_client_utilization play them. Every other GPU answers the MPS list empty.
 *
 * GPU health faults, planned in time since the nvmlInit that built the node (CLOCK_MONOTONIC),
 * as the Python double plays them (FakeGpu.lost, FakeNvml.inject_xid):
 *  - a lost GPU answers GPU_IS_LOST to every call on its handle (name, UUID and PCI info
 *    included) and to nvmlDeviceGetHandleByIndex_v2; nvmlDeviceGetCount_v2 still counts it. A
 *    handle taken before the loss stays valid (calls on it answer GPU_IS_LOST), so an exporter
 *    that identified the GPU before keeps its identity.
 *  - an XID critical-error event is handed out once, by the first nvmlEventSetWait_v2 on an
 *    event set with its GPU registered once its time has come (oldest first), whether or not
 *    the GPU is lost by then (XID 79 is how a GPU falls off the bus). A wait with no event due
 *    sleeps until its timeout or the next planned event, whichever comes first.
 *
 * Configuration, read by nvmlInit* when the library goes from uninitialised to initialised:
 *   FAKE_NVML_GPUS                 GPUs (default 8, at most 64)
 *   FAKE_NVML_PROCESSES_PER_GPU    compute processes per GPU (default 64)
 *   FAKE_NVML_HISTORY_SECONDS      seconds of per-process samples kept (default 4)
 *   FAKE_NVML_GPM                  1: GPM supported (default), 0: not
 *   FAKE_NVML_MEMORY_RESERVED_MIB  memory the driver reserves per GPU, MiB (default 615, as
 *                                  on an idle H200 with driver 580.159; at most 80896)
 *   FAKE_NVML_NO_MEMORY_V2         1: as a driver before R510, without
 *                                  nvmlDeviceGetMemoryInfo_v2 (it answers
 *                                  FUNCTION_NOT_FOUND, as pynvml does for a missing symbol);
 *                                  0 (default): v2 answers
 *   FAKE_NVML_REMAPPED_ROWS        per-GPU row remappers, entries separated by ';':
 *                                  "GPU:CORR,UNC,PENDING,FAILED" (rows remapped for
 *                                  correctable and uncorrectable errors, then 0 or 1 for a
 *                                  remap pending and a remap failed), or "GPU:unsupported"
 *                                  (NOT_SUPPORTED, as before Ampere), e.g.
 *                                  "1:0,2,1,0;3:unsupported"; a GPU not named has no row
 *                                  remapped, none pending, none failed. A malformed entry
 *                                  is reported on stderr and left out.
 *   FAKE_NVML_LOST                 lost GPUs, entries separated by ';': "GPU@SECONDS" (GPU
 *                                  lost from SECONDS after nvmlInit on; decimal seconds, e.g.
 *                                  "2@3;0@0.5"; "2@0": lost from the start). A malformed entry
 *                                  is reported on stderr and left out.
 *   FAKE_NVML_XIDS                 XID critical errors, entries separated by ';':
 *                                  "GPU:XID@SECONDS" (e.g. "0:79@2;1:48@4.5"), at most
 *                                  MAX_XID_EVENTS. A malformed entry is reported on stderr
 *                                  and left out.
 *   FAKE_NVML_THROTTLE_RESETS      GPU resets as the throttle counters see them, entries
 *                                  separated by ';': "GPU@SECONDS" (e.g. "0@0.5"): from
 *                                  SECONDS after nvmlInit on, the GPU's violation counters
 *                                  and clocks-event-reason durations start again from 0
 *                                  (the driver's do after a GPU reset), and its power
 *                                  counter (field 74, NVML_PERF_POLICY_POWER) grows by the
 *                                  time since then (clocks held down by power all the
 *                                  time); everything else about the GPU is unchanged. A
 *                                  malformed entry is reported on stderr and left out.
 *   FAKE_NVML_MPS                  CUDA MPS processes, entries separated by ';':
 *                                  "GPU:server:PID:MIB" (the nvidia-cuda-mps-server, MIB of
 *                                  device memory) and "GPU:client:PID:MIB:SM" (an MPS
 *                                  client, SM its utilization in percent), each optionally
 *                                  followed by "@SECONDS": the process exits SECONDS after
 *                                  nvmlInit. E.g. the H200's "0:server:787:66;
 *                                  0:client:752:4968:70;0:client:754:1704:25". A GPU with
 *                                  an entry runs these processes instead of the synthesized
 *                                  ones: its compute list names the server and the clients,
 *                                  nvmlDeviceGetMPSComputeRunningProcesses_v3/_v2 the
 *                                  clients (same bytes); at most MAX_MPS_PROCESSES. A
 *                                  malformed entry is reported on stderr and left out.
 *   FAKE_NVML_MPS_CLIENT_UTILIZATION
 *                                  0 (default, as the H200 with driver 580.159.04 answers):
 *                                  on an MPS GPU per-process utilization has samples for
 *                                  the server's PID only, smUtil the running clients' added
 *                                  up (at most 100); 1: one sample per running client (its
 *                                  SM) and per server (0), as a driver reporting clients
 *                                  would.
 *
 * Return codes follow the Python double where the two could differ (nvmlShutdown when not
 * initialised answers SUCCESS; a size query of the process utilization answers
 * INSUFFICIENT_SIZE; a buffer too small gets the oldest samples that fit).
 *
 * Thread safety: the node is immutable between nvmlInit and nvmlShutdown (a GPU's loss is a
 * time fixed at init, compared with the clock); the init refcount, the event sets and the XID
 * events' delivery are guarded by one mutex. nvmlEventSetWait_v2 sleeps without holding it
 * (ctypes has released the GIL for the call).
 *
 * Build: gcc -O2 -shared -fPIC -o libnvidia-ml-fake.so fake_nvml.c
 */

#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_UNKNOWN = 999,
};

/* Constants of nvml.h (pynvml's values). */
#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_MEMORY_ERROR_TYPE_CORRECTED 0
#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_GPM_SUPPORT_VERSION 1
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_METRIC_MAX 477 /* pynvml's c_nvmlGpmMetricsGet_t has this many slots */
#define NO_INSTANCE 0xFFFFFFFFU            /* gpuInstanceId outside any MIG instance */

/* Structs, as nvml.h (and pynvml's ctypes mirrors) lay them out. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* nvml.h's NVML_STRUCT_VERSION(Memory, 2): the struct's size | version << 24; pynvml's
   nvmlMemory_v2 is 0x02000028 (40 bytes: the uint is padded to 8). */
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24)))
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t as pynvml lays it out");

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* nvmlProcessInfo_t: the element of both the _v2 and the _v3 process lists. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned long long referenceTime;
    unsigned long long violationTime;
} nvmlViolationTime_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

struct fake_gpm_sample {
    unsigned int magic;
    int filled;
    unsigned int device;
    unsigned long long sequence;
};
typedef struct fake_gpm_sample *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

struct fake_device {
    unsigned int index;
    char uuid[64];
    char pci_bus_id[32];
    int remap_supported; /* nvmlDeviceGetRemappedRows answers (else NOT_SUPPORTED) */
    unsigned int remap_correctable, remap_uncorrectable, remap_pending, remap_failed;
    unsigned long long lost_at_ns; /* lost from this time since init on; NEVER: not lost */
    unsigned long long throttle_reset_ns; /* counters start again then (FAKE_NVML_THROTTLE_RESETS) */
    unsigned int mps;              /* MPS processes planted on it (FAKE_NVML_MPS) */
};
typedef struct fake_device *nvmlDevice_t;

struct fake_event_set {
    int in_use;
    unsigned long long registered; /* bit g: GPU g registered for XID events */
};
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* ----------------------------------------------------------------------------------------- */
/* The node */

#define MAX_GPUS 64
#define MAX_EVENT_SETS 64
#define MAX_PROCESSES_PER_GPU 100000U
#define MAX_HISTORY_SECONDS 3600U
#define MAX_XID_EVENTS 256
#define MAX_FAULT_SECONDS 1000000 /* the latest time a fault can be planned for (~11 days) */
#define NEVER ULLONG_MAX
#define STR_(x) #x
#define STR(x) STR_(x) /* a macro's value as a string literal */
#define GIB (1024ULL * 1024ULL * 1024ULL)

static const char DRIVER_VERSION[] = "550.54.15";
static const char GPU_NAME[] = "NVIDIA A100-SXM4-80GB";
#define MEMORY_TOTAL_GIB 80U
static const unsigned long long MEMORY_TOTAL = MEMORY_TOTAL_GIB * GIB;
static const unsigned long long MEMORY_USED = 1 * GIB;
#define MIB (1024ULL * 1024ULL)
/* The driver's own memory by default (v2's reserved), MiB: what an idle H200 with driver
   580.159 showed; at most what the 80 GiB leave beside MEMORY_USED. */
#define DEFAULT_MEMORY_RESERVED_MIB 615U
#define MAX_MEMORY_RESERVED_MIB (unsigned int)((MEMORY_TOTAL_GIB - 1) * 1024U)
static const unsigned int UTIL_GPU = 50, UTIL_MEMORY = 20;
static const unsigned int TEMPERATURE_C = 45;
static const unsigned int POWER_MW = 250000, POWER_LIMIT_MW = 400000;
static const unsigned long long ENERGY_MJ = 1000000000ULL;
static const unsigned int SM_CLOCK_MHZ = 1410, MEM_CLOCK_MHZ = 1593;
static const unsigned int FAN_PERCENT = 30;
static const unsigned int PCI_DEVICE_ID = 0x20B210DEU;    /* A100-SXM4-80GB */
static const unsigned int PCI_SUBSYSTEM_ID = 0x147F10DEU;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count;                 /* written under g_lock, read atomically */
static unsigned int g_gpus;              /* the node: set at init, constant until shutdown */
static unsigned int g_processes_per_gpu;
static unsigned int g_history_seconds;
static unsigned int g_gpm;
static unsigned long long g_gpm_sequence;   /* atomic */
static long g_gpm_samples;                  /* atomic: allocated and not freed */
static unsigned long long g_process_memory;
static unsigned long long g_memory_reserved;  /* bytes (FAKE_NVML_MEMORY_RESERVED_MIB) */
static unsigned int g_memory_v2;              /* 0: as a driver without _v2 (before R510) */
static unsigned long long g_memory_calls[3];  /* atomic: [1] v1, [2] v2 calls since init */
static struct fake_device g_devices[MAX_GPUS];
static struct fake_event_set g_event_sets[MAX_EVENT_SETS];
static struct timespec g_init_time;         /* CLOCK_MONOTONIC at the init that built the node */

/* A planned XID event (FAKE_NVML_XIDS), sorted by time; delivered under g_lock. */
struct fake_xid_event {
    unsigned int gpu;
    unsigned int xid;
    unsigned long long at_ns; /* since init */
    int delivered;
};
static struct fake_xid_event g_xid_events[MAX_XID_EVENTS];
static unsigned int g_xid_event_count;

/* An MPS process (FAKE_NVML_MPS), running from init until stop_ns (NEVER: for good). */
#define MAX_MPS_PROCESSES 32
#define MAX_MPS_MIB (MEMORY_TOTAL_GIB * 1024U)
struct fake_mps_process {
    unsigned int gpu;
    unsigned int pid;
    int server;               /* 1: nvidia-cuda-mps-server, 0: a client */
    unsigned long long bytes;
    unsigned int sm;          /* a client's SM utilization, percent */
    unsigned long long stop_ns;
};
static struct fake_mps_process g_mps[MAX_MPS_PROCESSES];
static unsigned int g_mps_count;
static unsigned int g_mps_client_utilization; /* 1: samples per client; 0: the server's */

static unsigned int env_uint(const char *name, unsigned int fallback, unsigned int max) {
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || text[0] == '-') {
        fprintf(stderr, "fake libnvidia-ml: %s=%s is not a number; using %u\n", name, text,
                fallback);
        return fallback;
    }
    if (value > max) {
        fprintf(stderr, "fake libnvidia-ml: %s=%lu is over %u; using %u\n", name, value, max,
                max);
        return max;
    }
    return (unsigned int)value;
}

/* One FAKE_NVML_REMAPPED_ROWS entry: "GPU:CORR,UNC,PENDING,FAILED" or "GPU:unsupported";
   0 when it is malformed. */
static int set_remapped_rows(const char *entry) {
    unsigned int gpu = 0, corr = 0, unc = 0, pending = 0, failed = 0;
    int used = -1;
    size_t length = strlen(entry);
    if (strchr(entry, '-') != NULL || strchr(entry, ' ') != NULL)
        return 0;
    if (sscanf(entry, "%u:%u,%u,%u,%u%n", &gpu, &corr, &unc, &pending, &failed, &used) == 5
        && used >= 0 && (size_t)used == length && gpu < MAX_GPUS && pending <= 1
        && failed <= 1) {
        struct fake_device *d = &g_devices[gpu];
        d->remap_supported = 1;
        d->remap_correctable = corr;
        d->remap_uncorrectable = unc;
        d->remap_pending = pending;
        d->remap_failed = failed;
        return 1;
    }
    used = -1;
    if (sscanf(entry, "%u:unsupported%n", &gpu, &used) == 1 && used >= 0 &&
        (size_t)used == length && gpu < MAX_GPUS) {
        g_devices[gpu].remap_supported = 0;
        return 1;
    }
    return 0;
}

/* A decimal number at *text (digits, optionally '.' and more digits; no sign, no exponent),
   up to MAX_FAULT_SECONDS, as nanoseconds; *text moves past it. 0 when there is none. */
static int parse_seconds(const char **text, unsigned long long *ns) {
    const char *p = *text;
    unsigned long long whole = 0, fraction = 0, scale = 1000000000ULL;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        whole = whole * 10 + (unsigned long long)(*p - '0');
        if (whole > MAX_FAULT_SECONDS)
            return 0;
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            if (scale > 1) {
                scale /= 10;
                fraction += (unsigned long long)(*p - '0') * scale;
            }
        }
    }
    if (digits == 0)
        return 0;
    *ns = whole * 1000000000ULL + fraction;
    *text = p;
    return 1;
}

/* An unsigned decimal at *text (digits only) below `limit`; *text moves past it. */
static int parse_uint(const char **text, unsigned long long limit, unsigned int *value) {
    const char *p = *text;
    unsigned long long v = 0;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (unsigned long long)(*p - '0');
        if (v >= limit)
            return 0;
    }
    *value = (unsigned int)v;
    *text = p;
    return 1;
}

/* One FAKE_NVML_LOST entry: "GPU@SECONDS"; 0 when it is malformed. */
static int set_lost(const char *entry) {
    unsigned int gpu;
    unsigned long long at_ns;
    const char *p = entry;
    if (!parse_uint(&p, MAX_GPUS, &gpu) || *p++ != '@' || !parse_seconds(&p, &at_ns) ||
        *p != '\0')
        return 0;
    g_devices[gpu].lost_at_ns = at_ns;
    return 1;
}

/* One FAKE_NVML_THROTTLE_RESETS entry: "GPU@SECONDS"; 0 when it is malformed. */
static int set_throttle_reset(const char *entry) {
    unsigned int gpu;
    unsigned long long at_ns;
    const char *p = entry;
    if (!parse_uint(&p, MAX_GPUS, &gpu) || *p++ != '@' || !parse_seconds(&p, &at_ns) ||
        *p != '\0')
        return 0;
    g_devices[gpu].throttle_reset_ns = at_ns;
    return 1;
}

/* One FAKE_NVML_XIDS entry: "GPU:XID@SECONDS"; 0 when it is malformed or there are already
   MAX_XID_EVENTS. */
static int add_xid(const char *entry) {
    unsigned int gpu, xid;
    unsigned long long at_ns;
    const char *p = entry;
    if (!parse_uint(&p, MAX_GPUS, &gpu) || *p++ != ':' || !parse_uint(&p, 1ULL << 32, &xid) ||
        *p++ != '@' || !parse_seconds(&p, &at_ns) || *p != '\0' ||
        g_xid_event_count >= MAX_XID_EVENTS)
        return 0;
    /* Insert in time order, after the events planned for the same time (stable). */
    unsigned int i = g_xid_event_count++;
    for (; i > 0 && g_xid_events[i - 1].at_ns > at_ns; i--)
        g_xid_events[i] = g_xid_events[i - 1];
    g_xid_events[i] = (struct fake_xid_event){gpu, xid, at_ns, 0};
    return 1;
}

/* One FAKE_NVML_MPS entry: "GPU:server:PID:MIB" or "GPU:client:PID:MIB:SM", optionally
   "@SECONDS"; 0 when it is malformed, names a PID already planted on that GPU, or there are
   already MAX_MPS_PROCESSES. */
static int add_mps(const char *entry) {
    struct fake_mps_process m = {0, 0, 0, 0, 0, NEVER};
    unsigned int mib = 0;
    const char *p = entry;
    if (!parse_uint(&p, MAX_GPUS, &m.gpu) || *p++ != ':')
        return 0;
    if (strncmp(p, "server:", 7) == 0) {
        m.server = 1;
        p += 7;
    } else if (strncmp(p, "client:", 7) == 0) {
        p += 7;
    } else {
        return 0;
    }
    if (!parse_uint(&p, 1ULL << 32, &m.pid) || m.pid == 0 || *p++ != ':' ||
        !parse_uint(&p, MAX_MPS_MIB + 1ULL, &mib))
        return 0;
    if (!m.server && (*p++ != ':' || !parse_uint(&p, 101, &m.sm)))
        return 0;
    if (*p == '@') {
        p++;
        if (!parse_seconds(&p, &m.stop_ns))
            return 0;
    }
    if (*p != '\0' || g_mps_count >= MAX_MPS_PROCESSES)
        return 0;
    for (unsigned int i = 0; i < g_mps_count; i++)
        if (g_mps[i].gpu == m.gpu && g_mps[i].pid == m.pid)
            return 0;
    m.bytes = (unsigned long long)mib * MIB;
    g_mps[g_mps_count++] = m;
    g_devices[m.gpu].mps++;
    return 1;
}

/* Apply `set` to every entry of the environment variable `name` (entries separated by ';',
   empty ones skipped); a malformed entry is reported on stderr (`form` says what it should
   be) and left out. */
static void entries_from_env(const char *name, int (*set)(const char *), const char *form) {
    const char *text = getenv(name);
    if (text == NULL)
        return;
    while (*text != '\0') {
        size_t n = strcspn(text, ";");
        char entry[64];
        if (n >= sizeof entry) {
            fprintf(stderr, "fake libnvidia-ml: %s entry '%.*s...' is too long; left out\n",
                    name, 20, text);
        } else if (n > 0) {
            memcpy(entry, text, n);
            entry[n] = '\0';
            if (!set(entry))
                fprintf(stderr, "fake libnvidia-ml: %s entry '%s' is not %s; left out\n", name,
                        entry, form);
        }
        text += n;
        if (*text == ';')
            text++;
    }
}

/* Build the node from the environment (under g_lock, while uninitialised). */
static void build_node(void) {
    g_gpus = env_uint("FAKE_NVML_GPUS", 8, MAX_GPUS);
    g_processes_per_gpu = env_uint("FAKE_NVML_PROCESSES_PER_GPU", 64, MAX_PROCESSES_PER_GPU);
    g_history_seconds = env_uint("FAKE_NVML_HISTORY_SECONDS", 4, MAX_HISTORY_SECONDS);
    g_gpm = env_uint("FAKE_NVML_GPM", 1, 1);
    if (g_history_seconds == 0)
        g_history_seconds = 1;
    g_process_memory = g_processes_per_gpu ? 72 * GIB / g_processes_per_gpu : 0;
    g_memory_reserved = (unsigned long long)env_uint("FAKE_NVML_MEMORY_RESERVED_MIB",
                                                     DEFAULT_MEMORY_RESERVED_MIB,
                                                     MAX_MEMORY_RESERVED_MIB) * MIB;
    g_memory_v2 = !env_uint("FAKE_NVML_NO_MEMORY_V2", 0, 1);
    for (unsigned int v = 0; v < 3; v++)
        __atomic_store_n(&g_memory_calls[v], 0, __ATOMIC_RELAXED);
    for (unsigned int g = 0; g < MAX_GPUS; g++) {
        struct fake_device *d = &g_devices[g];
        d->index = g;
        /* str(uuid.UUID(int=0xA1000000 + g)) */
        snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012x", 0xA1000000U + g);
        snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x10U + g);
        d->remap_supported = 1;
        d->remap_correctable = d->remap_uncorrectable = 0;
        d->remap_pending = d->remap_failed = 0;
        d->lost_at_ns = NEVER;
        d->throttle_reset_ns = NEVER;
        d->mps = 0;
    }
    for (unsigned int i = 0; i < MAX_EVENT_SETS; i++)
        g_event_sets[i].registered = 0; /* the handles of a previous session are gone */
    g_xid_event_count = 0;
    entries_from_env("FAKE_NVML_REMAPPED_ROWS", set_remapped_rows,
                     "GPU:CORR,UNC,PENDING,FAILED (PENDING and FAILED 0 or 1, GPU below "
                     STR(MAX_GPUS) ") or GPU:unsupported");
    entries_from_env("FAKE_NVML_LOST", set_lost,
                     "GPU@SECONDS (GPU below " STR(MAX_GPUS) ", SECONDS a decimal number of "
                     "seconds since nvmlInit, at most " STR(MAX_FAULT_SECONDS) ")");
    entries_from_env("FAKE_NVML_THROTTLE_RESETS", set_throttle_reset,
                     "GPU@SECONDS (GPU below " STR(MAX_GPUS) ", SECONDS a decimal number of "
                     "seconds since nvmlInit, at most " STR(MAX_FAULT_SECONDS) ")");
    entries_from_env("FAKE_NVML_XIDS", add_xid,
                     "GPU:XID@SECONDS (GPU below " STR(MAX_GPUS) ", SECONDS a decimal number of "
                     "seconds since nvmlInit, at most " STR(MAX_FAULT_SECONDS) "; at most "
                     STR(MAX_XID_EVENTS) " entries)");
    g_mps_count = 0;
    g_mps_client_utilization = env_uint("FAKE_NVML_MPS_CLIENT_UTILIZATION", 0, 1);
    entries_from_env("FAKE_NVML_MPS", add_mps,
                     "GPU:server:PID:MIB or GPU:client:PID:MIB:SM, optionally @SECONDS (GPU "
                     "below " STR(MAX_GPUS) ", PID above 0, MIB at most the GPU's memory, SM a "
                     "percentage; a PID once per GPU; at most " STR(MAX_MPS_PROCESSES)
                     " entries)");
    clock_gettime(CLOCK_MONOTONIC, &g_init_time);
}

/* Nanoseconds since the init that built the node. */
static unsigned long long since_init_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ns = (long long)(now.tv_sec - g_init_time.tv_sec) * 1000000000LL
                   + (now.tv_nsec - g_init_time.tv_nsec);
    return ns < 0 ? 0 : (unsigned long long)ns;
}

/* Whether the GPU is lost by now (no clock read for a GPU never lost). */
static int is_lost(const struct fake_device *dev) {
    return dev->lost_at_ns != NEVER && since_init_ns() >= dev->lost_at_ns;
}

static int initialised(void) {
    return __atomic_load_n(&g_init_count, __ATOMIC_ACQUIRE) > 0;
}

/* The device behind a handle, or NULL when it is not one of ours. */
static struct fake_device *device_of(nvmlDevice_t handle) {
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)g_devices;
    if (p < base || (p - base) % sizeof(struct fake_device) != 0)
        return NULL;
    uintptr_t index = (p - base) / sizeof(struct fake_device);
    return index < g_gpus ? &g_devices[index] : NULL;
}

/* Start of every device entry point: initialised, a valid handle, a GPU not lost. */
#define DEVICE_ENTRY(handle, dev)                          \
    if (!initialised())                                    \
        return NVML_ERROR_UNINITIALIZED;                   \
    struct fake_device *dev = device_of(handle);           \
    if (dev == NULL)                                       \
        return NVML_ERROR_INVALID_ARGUMENT;                \
    if (is_lost(dev))                                      \
        return NVML_ERROR_GPU_IS_LOST

static nvmlReturn_t write_string(char *buf, unsigned int length, const char *text) {
    size_t n = strlen(text);
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, text, n + 1);
    return NVML_SUCCESS;
}

#define WRITE(out, value)                         \
    do {                                          \
        if ((out) == NULL)                        \
            return NVML_ERROR_INVALID_ARGUMENT;   \
        *(out) = (value);                         \
        return NVML_SUCCESS;                      \
    } while (0)

/* ----------------------------------------------------------------------------------------- */
/* Library */

static nvmlReturn_t init(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0)
        build_node();
    __atomic_store_n(&g_init_count, g_init_count + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init();
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }

EXPORT nvmlReturn_t nvmlInit(void) { return init(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count > 0)
        __atomic_store_n(&g_init_count, g_init_count - 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* Not NVML: the init refcount, for tests (every nvmlInit matched by an nvmlShutdown). */
EXPORT int fakeNvmlInitCount(void) { return __atomic_load_n(&g_init_count, __ATOMIC_ACQUIRE); }

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 20: return "Insufficient Memory";
    case 25: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return write_string(version, length, DRIVER_VERSION);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    WRITE(count, g_gpus);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (index >= g_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(&g_devices[index]))
        return NVML_ERROR_GPU_IS_LOST; /* as FakeNvml: the handle of a lost GPU is not given */
    WRITE(device, &g_devices[index]);
}

/* ----------------------------------------------------------------------------------------- */
/* Device identity and readings */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    return write_string(name, length, GPU_NAME);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_ENTRY(device, dev);
    return write_string(uuid, length, dev->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_ENTRY(device, dev);
    WRITE(index, dev->index);
}

/* The N of /dev/nvidia<N>: FakeNvml's default (no minor given), the index. This double has
 * no MIG slices, whose handles the real call refuses. */
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_ENTRY(device, dev);
    WRITE(minor, dev->index);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_ENTRY(device, dev);
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", dev->pci_bus_id);
    /* FakeNvml writes busId[:15] (16 bytes with the NUL) into the legacy field too. */
    memcpy(pci->busIdLegacy, dev->pci_bus_id, sizeof pci->busIdLegacy - 1);
    pci->domain = 0;
    pci->bus = 0x10U + dev->index;
    pci->device = 0;
    pci->pciDeviceId = PCI_DEVICE_ID;
    pci->pciSubSystemId = PCI_SUBSYSTEM_ID;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(arch, NVML_DEVICE_ARCH_AMPERE);
}

/* v1 (nvmlMemory_t): used is total - free, so it counts the driver's reserved memory, as the
   real v1 does (an idle H200: 615 MiB used where nvidia-smi says 0). */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    __atomic_add_fetch(&g_memory_calls[1], 1, __ATOMIC_RELAXED);
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = MEMORY_TOTAL;
    memory->free = MEMORY_TOTAL - g_memory_reserved - MEMORY_USED;
    memory->used = MEMORY_TOTAL - memory->free;
    return NVML_SUCCESS;
}

/* v2 (nvmlMemory_v2_t, R510 and newer, what nvidia-smi reads): reserved apart, used without
   it. With FAKE_NVML_NO_MEMORY_V2=1 it answers FUNCTION_NOT_FOUND, what pynvml raises for a
   driver without the symbol (a loaded library cannot hide one of its symbols). */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    __atomic_add_fetch(&g_memory_calls[2], 1, __ATOMIC_RELAXED);
    if (!g_memory_v2)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = MEMORY_TOTAL;
    memory->reserved = g_memory_reserved;
    memory->used = MEMORY_USED;
    memory->free = MEMORY_TOTAL - g_memory_reserved - MEMORY_USED;
    return NVML_SUCCESS;
}

/* Not NVML: calls of nvmlDeviceGetMemoryInfo (version 1) or nvmlDeviceGetMemoryInfo_v2
   (version 2) since the nvmlInit that built the node, for tests. */
EXPORT unsigned long long fakeNvmlMemoryInfoCalls(unsigned int version) {
    return version == 1 || version == 2
               ? __atomic_load_n(&g_memory_calls[version], __ATOMIC_RELAXED)
               : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                   nvmlUtilization_t *utilization) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = UTIL_GPU;
    utilization->memory = UTIL_MEMORY;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor,
                                              unsigned int *temp) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    WRITE(temp, TEMPERATURE_C);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(power, POWER_MW);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(limit, POWER_LIMIT_MW);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                         unsigned long long *energy) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(energy, ENERGY_MJ);
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(speed, FAN_PERCENT);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
        WRITE(clock, SM_CLOCK_MHZ);
    case NVML_CLOCK_MEM:
        WRITE(clock, MEM_CLOCK_MHZ);
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type,
                                                 int counter_type, unsigned long long *count) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)counter_type;
    if (error_type != NVML_MEMORY_ERROR_TYPE_CORRECTED &&
        error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        return NVML_ERROR_INVALID_ARGUMENT;
    WRITE(count, 0ULL);
}

/* Row remapper: FAKE_NVML_REMAPPED_ROWS, else no row remapped, none pending, none failed. */
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                               unsigned int *uncRows, unsigned int *isPending,
                                               unsigned int *failureOccurred) {
    DEVICE_ENTRY(device, dev);
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!dev->remap_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = dev->remap_correctable;
    *uncRows = dev->remap_uncorrectable;
    *isPending = dev->remap_pending;
    *failureOccurred = dev->remap_failed;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------- */
/* MIG: these GPUs cannot do it (FakeGpu.mig_enabled None) */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                          unsigned int *pending) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)current;
    (void)pending;
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)count;
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *mig) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)index;
    (void)mig;
    return NVML_ERROR_INVALID_ARGUMENT; /* MIG is not enabled */
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    WRITE(is_mig, 0U);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)id;
    return NVML_ERROR_INVALID_ARGUMENT; /* not a MIG device handle */
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                                  nvmlDevice_t *device) {
    DEVICE_ENTRY(mig, dev);
    (void)dev;
    (void)device;
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* ----------------------------------------------------------------------------------------- */
/* Processes */

/* The size query (infos NULL, or *count too small) answers INSUFFICIENT_SIZE with the count,
   or SUCCESS when there are none. */
static nvmlReturn_t running_processes(struct fake_device *dev, unsigned int n,
                                      unsigned int *count, nvmlProcessInfo_t *infos) {
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (infos == NULL || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    unsigned int first_pid = 10000U + dev->index * g_processes_per_gpu;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = first_pid + i;
        infos[i].usedGpuMemory = g_process_memory;
        infos[i].gpuInstanceId = NO_INSTANCE;
        infos[i].computeInstanceId = NO_INSTANCE;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Whether an MPS process runs now (it has not reached its exit time). */
static int mps_running(const struct fake_mps_process *m) {
    return m->stop_ns == NEVER || since_init_ns() < m->stop_ns;
}

/* The running MPS processes of a GPU, servers too unless `clients_only`: the list answer of
   running_processes, from the same snapshot of the clock for the size and the entries. */
static nvmlReturn_t mps_processes(struct fake_device *dev, int clients_only,
                                  unsigned int *count, nvmlProcessInfo_t *infos) {
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_mps_process *running[MAX_MPS_PROCESSES];
    unsigned int n = 0;
    for (unsigned int i = 0; i < g_mps_count; i++) {
        const struct fake_mps_process *m = &g_mps[i];
        if (m->gpu == dev->index && !(clients_only && m->server) && mps_running(m))
            running[n++] = m;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = running[i]->pid;
        infos[i].usedGpuMemory = running[i]->bytes;
        infos[i].gpuInstanceId = NO_INSTANCE;
        infos[i].computeInstanceId = NO_INSTANCE;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                             unsigned int *count,
                                                             nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    if (dev->mps)
        return mps_processes(dev, 0, count, infos);
    return running_processes(dev, g_processes_per_gpu, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                             unsigned int *count,
                                                             nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    if (dev->mps)
        return mps_processes(dev, 0, count, infos);
    return running_processes(dev, g_processes_per_gpu, count, infos);
}

/* The MPS clients (Volta and newer); empty on a GPU without MPS, as the driver answers. */
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int *count,
                                                                nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    return mps_processes(dev, 1, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int *count,
                                                                nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    return mps_processes(dev, 1, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    return running_processes(dev, 0, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY(device, dev);
    return running_processes(dev, 0, count, infos);
}

/* One whole second's samples of an MPS GPU, as (pid, smUtil) into `out` (room for
   MAX_MPS_PROCESSES); the count. The processes running now: the server's PID alone with the
   clients' SM added up (at most 100), or with FAKE_NVML_MPS_CLIENT_UTILIZATION=1 each
   client's own and the server's 0. */
static unsigned int mps_tick(const struct fake_device *dev, unsigned int out[][2]) {
    unsigned int n = 0, total = 0, server = 0;
    for (unsigned int i = 0; i < g_mps_count; i++) {
        const struct fake_mps_process *m = &g_mps[i];
        if (m->gpu != dev->index || !mps_running(m))
            continue;
        if (m->server)
            server = m->pid;
        else
            total += m->sm;
        if (g_mps_client_utilization) {
            out[n][0] = m->pid;
            out[n][1] = m->server ? 0 : m->sm;
            n++;
        }
    }
    if (!g_mps_client_utilization && server != 0) {
        out[0][0] = server;
        out[0][1] = total > 100 ? 100 : total;
        n = 1;
    }
    return n;
}

/* Samples with timeStamp > lastSeenTimeStamp (us), oldest first; NOT_FOUND when there are
   none; samples NULL is the size query (INSUFFICIENT_SIZE with *count set); a buffer too
   small gets the oldest samples that fit. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                     nvmlProcessUtilizationSample_t *samples,
                                                     unsigned int *count,
                                                     unsigned long long last_seen_us) {
    DEVICE_ENTRY(device, dev);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int tick[MAX_MPS_PROCESSES][2];
    unsigned long long ppg = dev->mps ? mps_tick(dev, tick) : g_processes_per_gpu;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long newest = (unsigned long long)now.tv_sec; /* whole seconds: sample k */
    unsigned long long oldest = newest + 1 - g_history_seconds;
    unsigned long long first = last_seen_us / 1000000ULL + 1; /* k * 1e6 > last_seen */
    if (first < oldest)
        first = oldest;
    if (ppg == 0 || first > newest)
        return NVML_ERROR_NOT_FOUND;
    unsigned long long available = (newest - first + 1) * ppg;
    if (available > UINT_MAX)
        available = UINT_MAX;
    if (samples == NULL) {
        *count = (unsigned int)available;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long filled = *count < available ? *count : available;
    unsigned int first_pid = 10000U + dev->index * g_processes_per_gpu;
    for (unsigned long long j = 0; j < filled; j++) {
        unsigned long long k = first + j / ppg;
        unsigned int i = (unsigned int)(j % ppg);
        nvmlProcessUtilizationSample_t *s = &samples[j];
        s->pid = dev->mps ? tick[i][0] : first_pid + i;
        s->timeStamp = k * 1000000ULL;
        s->smUtil = dev->mps ? tick[i][1] : 1U + (unsigned int)((i + k) % 3);
        s->memUtil = dev->mps ? 0 : i % 2;
        s->encUtil = 0;
        s->decUtil = 0;
    }
    *count = (unsigned int)filled;
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------- */
/* Work signals: GPU-utilization samples, throttle time, GPM */

#define UTIL_SAMPLE_PERCENT 50U
#define NS 1000000000ULL

/* Samples with timeStamp > lastSeenTimeStamp (us), oldest first, one per whole second;
   NOT_FOUND when there are none; samples NULL is the size query (SUCCESS with the count, as
   pynvml's nvmlDeviceGetSamples expects). */
EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type,
                                          unsigned long long last_seen_us, int *value_type,
                                          unsigned int *count, nvmlSample_t *samples) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (count == NULL || value_type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long newest = (unsigned long long)now.tv_sec;
    unsigned long long oldest = newest + 1 - g_history_seconds;
    unsigned long long first = last_seen_us / 1000000ULL + 1;
    if (first < oldest)
        first = oldest;
    if (first > newest)
        return NVML_ERROR_NOT_FOUND;
    unsigned long long available = newest - first + 1;
    *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (samples == NULL) {
        *count = (unsigned int)available;
        return NVML_SUCCESS;
    }
    unsigned long long filled = *count < available ? *count : available;
    for (unsigned long long j = 0; j < filled; j++) {
        samples[j].timeStamp = (first + j) * 1000000ULL;
        samples[j].sampleValue.ullVal = 0;
        samples[j].sampleValue.uiVal = UTIL_SAMPLE_PERCENT;
    }
    *count = (unsigned int)filled;
    return NVML_SUCCESS;
}

/* The time since the GPU's planned reset (FAKE_NVML_THROTTLE_RESETS), ns; -1 before it or
   when none is planned. */
static long long since_throttle_reset_ns(const struct fake_device *dev) {
    if (dev->throttle_reset_ns == NEVER)
        return -1;
    unsigned long long now = since_init_ns();
    return now < dev->throttle_reset_ns ? -1 : (long long)(now - dev->throttle_reset_ns);
}

/* Violation time (ns) of a perf policy (NVML_PERF_POLICY_*), -1 when there is none. */
static long long violation_ns(const struct fake_device *dev, int policy) {
    long long reset = since_throttle_reset_ns(dev);
    if (reset >= 0) {
        switch (policy) {
        case 0: return reset; /* power, all the time since the reset */
        case 1: case 2: case 3: case 4: case 5: case 10: case 11: return 0;
        default: return -1;
        }
    }
    switch (policy) {
    case 0: return (long long)(5 * NS); /* power */
    case 1: return (long long)(2 * NS); /* thermal */
    case 2: case 3: case 4: case 5: case 10: case 11: return 0;
    default: return -1;
    }
}

/* A field value (ns), -1 when this GPU does not have the field. */
static long long field_ns(const struct fake_device *dev, unsigned int field_id) {
    static const int policies[] = {0, 1, 2, 3, 4, 5, 10, 11}; /* fields 74-81 */
    if (field_id >= 74 && field_id <= 81)
        return violation_ns(dev, policies[field_id - 74]);
    switch (field_id) {
    case 269: return since_throttle_reset_ns(dev) >= 0 ? 0 : (long long)(2 * NS); /* SW thermal */
    case 270: case 271: return 0;
    default: return -1;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count,
                                              nvmlFieldValue_t *values) {
    DEVICE_ENTRY(device, dev);
    if (values == NULL || count < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long now_us = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
    for (int i = 0; i < count; i++) {
        long long ns = field_ns(dev, values[i].fieldId);
        values[i].timestamp = now_us;
        values[i].latencyUsec = 0;
        if (ns < 0) {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        values[i].nvmlReturn = NVML_SUCCESS;
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        values[i].value.ullVal = (unsigned long long)ns;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, int policy,
                                                  nvmlViolationTime_t *out) {
    DEVICE_ENTRY(device, dev);
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    long long ns = violation_ns(dev, policy);
    if (ns < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    out->referenceTime = (unsigned long long)now.tv_sec * 1000000ULL
                         + (unsigned long long)now.tv_nsec / 1000ULL;
    out->violationTime = (unsigned long long)ns;
    return NVML_SUCCESS;
}

#define GPM_MAGIC 0x6770D5A1U

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    if (support == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = g_gpm;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (sample == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_gpm_sample *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NVML_ERROR_MEMORY;
    s->magic = GPM_MAGIC;
    __atomic_add_fetch(&g_gpm_samples, 1, __ATOMIC_RELAXED);
    *sample = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (sample == NULL || sample->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    __atomic_sub_fetch(&g_gpm_samples, 1, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}

/* Not NVML: GPM sample buffers allocated and not freed, for tests. */
EXPORT long fakeNvmlGpmSamples(void) { return __atomic_load_n(&g_gpm_samples, __ATOMIC_RELAXED); }

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    DEVICE_ENTRY(device, dev);
    if (!g_gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    if (sample == NULL || sample->magic != GPM_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    sample->filled = 1;
    sample->device = dev->index;
    sample->sequence = __atomic_add_fetch(&g_gpm_sequence, 1, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpu_instance_id,
                                         nvmlGpmSample_t sample) {
    DEVICE_ENTRY(device, dev);
    (void)dev;
    (void)gpu_instance_id;
    (void)sample;
    return NVML_ERROR_INVALID_ARGUMENT; /* MIG is not enabled */
}

/* The mean of a metric between two samples; a negative value: NOT_SUPPORTED. */
static double gpm_mean(unsigned int metric_id) {
    switch (metric_id) {
    case 1: return 90.0;    /* GRAPHICS_UTIL */
    case 2: return 40.0;    /* SM_UTIL */
    case 3: return 30.0;    /* SM_OCCUPANCY */
    case 5: return 25.0;    /* ANY_TENSOR_UTIL */
    case 10: return 60.0;   /* DRAM_BW_UTIL */
    case 20: return 50.0;   /* PCIE_TX_PER_SEC, MiB/s */
    case 21: return 100.0;  /* PCIE_RX_PER_SEC */
    case 60: return 1000.0; /* NVLINK_TOTAL_RX_PER_SEC */
    case 61: return 2000.0; /* NVLINK_TOTAL_TX_PER_SEC */
    default: return -1.0;
    }
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (get == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (get->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t a = get->sample1, b = get->sample2;
    if (a == NULL || b == NULL || a == b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC ||
        !a->filled || !b->filled || a->device != b->device || a->sequence >= b->sequence ||
        get->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < get->numMetrics; i++) {
        double mean = gpm_mean(get->metrics[i].metricId);
        get->metrics[i].nvmlReturn = mean < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
        get->metrics[i].value = mean < 0 ? 0.0 : mean;
    }
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------------------------- */
/* Events: sets can be created and registered; the XID events of FAKE_NVML_XIDS arrive */

static struct fake_event_set *event_set_of(nvmlEventSet_t handle) {
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)g_event_sets;
    if (p < base || (p - base) % sizeof(struct fake_event_set) != 0)
        return NULL;
    uintptr_t index = (p - base) / sizeof(struct fake_event_set);
    return index < MAX_EVENT_SETS ? &g_event_sets[index] : NULL;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = NVML_ERROR_MEMORY;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (!g_event_sets[i].in_use) {
            g_event_sets[i].in_use = 1;
            g_event_sets[i].registered = 0;
            *set = &g_event_sets[i];
            rc = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                              nvmlEventSet_t set) {
    DEVICE_ENTRY(device, dev);
    struct fake_event_set *es = event_set_of(set);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    if (es != NULL && es->in_use) {
        if (types & NVML_EVENT_TYPE_XID_CRITICAL_ERROR)
            es->registered |= 1ULL << dev->index;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Not NVML: planned XID events not handed out yet, for tests. */
EXPORT int fakeNvmlXidEventsPending(void) {
    pthread_mutex_lock(&g_lock);
    int pending = 0;
    for (unsigned int i = 0; i < g_xid_event_count; i++)
        pending += !g_xid_events[i].delivered;
    pthread_mutex_unlock(&g_lock);
    return pending;
}

/* The oldest XID event due by `now_ns` for a GPU registered in `es`, marked delivered; and
   in *next_ns the time of the next event not yet due (NEVER: none). Under g_lock. */
static struct fake_xid_event *take_due_xid(const struct fake_event_set *es,
                                           unsigned long long now_ns,
                                           unsigned long long *next_ns) {
    *next_ns = NEVER;
    for (unsigned int i = 0; i < g_xid_event_count; i++) {
        struct fake_xid_event *e = &g_xid_events[i];
        if (e->delivered)
            continue;
        if (e->at_ns > now_ns) {
            *next_ns = e->at_ns; /* sorted by time: the first one not due is the next */
            break;
        }
        if (es->registered & (1ULL << e->gpu)) {
            e->delivered = 1;
            return e;
        }
    }
    return NULL;
}

/* The next XID event due for a GPU registered in the set (each event is handed out once,
   oldest first); when none is due, sleeps until the timeout or the next planned event,
   whichever comes first, and looks again; TIMEOUT at the deadline. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                         unsigned int timeout_ms) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_event_set *es = event_set_of(set);
    pthread_mutex_lock(&g_lock);
    int valid = es != NULL && es->in_use;
    pthread_mutex_unlock(&g_lock);
    if (!valid || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long deadline_ns = since_init_ns() + timeout_ms * 1000000ULL;
    for (;;) {
        unsigned long long now_ns = since_init_ns(), next_ns = NEVER;
        pthread_mutex_lock(&g_lock);
        struct fake_xid_event *event = es->in_use ? take_due_xid(es, now_ns, &next_ns) : NULL;
        struct fake_xid_event due = event != NULL ? *event : (struct fake_xid_event){0};
        pthread_mutex_unlock(&g_lock);
        if (event != NULL) {
            memset(data, 0, sizeof *data);
            data->device = &g_devices[due.gpu];
            data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
            data->eventData = due.xid;
            data->gpuInstanceId = NO_INSTANCE; /* not under MIG */
            data->computeInstanceId = NO_INSTANCE;
            return NVML_SUCCESS;
        }
        if (now_ns >= deadline_ns)
            return NVML_ERROR_TIMEOUT;
        unsigned long long wake_ns = next_ns < deadline_ns ? next_ns : deadline_ns;
        /* Sleep until then on CLOCK_MONOTONIC (absolute, so a signal costs nothing). */
        unsigned long long wake_sec = wake_ns / 1000000000ULL;
        long wake_nsec = g_init_time.tv_nsec + (long)(wake_ns % 1000000000ULL);
        struct timespec until = {g_init_time.tv_sec + (time_t)wake_sec, wake_nsec};
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
        }
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_event_set *es = event_set_of(set);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    if (es != NULL && es->in_use) {
        es->in_use = 0;
        es->registered = 0;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
