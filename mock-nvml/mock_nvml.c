/* A mock libnvidia-ml.so.1 for CI without GPUs.
 *
 * It exports the NVML entry points the plugin's NVML backend (through nvml-wrapper) calls, with
 * NVML's ABI, and answers from a node description generated from our hardware profiles
 * (gpu-dra-api/data/gpus.yaml; dra-plugin/src/backend/nvml_mock_root.rs generates it and documents
 * the format; `dra-plugin mock-nvml-root --profile h100-80gb:8 --out DIR`, or with the profile or
 * hardware YAML file named by SIMULATED_PROFILES / SIMULATED_HARDWARE_FILE, writes a driver root
 * with it). The node description is `mock-nvml.conf` next to the library itself (so a driver root
 * is self-contained and several copies can live in one process), or the file MOCK_NVML_CONFIG
 * names. Without one, init fails like on a node whose driver is not loaded. Optional lines of the description (each
 * also settable by an environment variable of the same name in capitals, MOCK_NVML_STATE, ...):
 *
 *   state <path>       file holding MIG mode and MIG instances, shared (under flock) by every
 *                      process loading the mock with the same path
 *   events <path>      file of injected events, one a line, appended by tests:
 *                        xid <minor> <code> [<gi> <ci>]   critical XID error
 *                        sbe <minor> / dbe <minor>        single-/double-bit ECC error
 *                        lost <minor>                     the GPU fell off the bus
 *   fail_init_while <path>   while that file exists, init fails with DRIVER_NOT_LOADED
 *
 * MIG semantics follow the hardware: GPU instances only at the profile's possible placements,
 * overlapping memory slices, exhausted compute slices and per-profile instance limits are refused
 * with INSUFFICIENT_RESOURCES, a GPU instance with compute instances cannot be destroyed, and MIG
 * mode cannot be disabled while instances exist. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvml_abi.h"

#define API __attribute__((visibility("default")))

#define MAX_GPUS 64
#define MAX_PROFILES 24
#define MAX_PLACEMENTS 8
#define MAX_GI 32
#define MAX_CI 8

enum { TAG_GPU = 0x6d475055, TAG_MIG, TAG_GI, TAG_CI, TAG_SET };

struct profile {
    int present;
    unsigned index, id, slices, instances, mps, ce, dec, enc, jpg, ofa;
    unsigned long long mem_mb;
    char name[96];
    unsigned nplace;
    nvmlGpuInstancePlacement_t place[MAX_PLACEMENTS];
    char uuid[MAX_PLACEMENTS][64];
};

struct gi;
struct ci {
    unsigned tag; /* TAG_CI: the nvmlComputeInstance_t */
    int used;
    unsigned id, profile_id, slices, start;
    struct gi *gi;
    struct {
        unsigned tag; /* TAG_MIG: the MIG device's nvmlDevice_t */
        struct ci *ci;
    } mig;
};

struct gpu;
struct gi {
    unsigned tag; /* TAG_GI */
    int used;
    unsigned id;
    struct profile *p;
    unsigned start, size;
    struct gpu *gpu;
    struct ci ci[MAX_CI];
};

struct gpu {
    unsigned tag; /* TAG_GPU */
    unsigned index, minor;
    char uuid[64], busid[32], name[96];
    unsigned pcidev, brand, arch;
    int ccmaj, ccmin;
    unsigned long long mem;
    int numa, addr;
    int mig_capable, mig_needs_reset;
    unsigned compute_mode;
    unsigned mig_cur, mig_pend, mem_slices, compute_slices;
    unsigned nprof;
    struct profile prof[MAX_PROFILES];
    struct gi gi[MAX_GI];
    int lost;
};

struct evset {
    unsigned tag; /* TAG_SET */
    unsigned long long mask[MAX_GPUS];
    long offset;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static int loaded;
static char driver_version[80] = "580.105.08";
static int cuda_version = 13000;
static struct gpu *gpus;
static unsigned ngpus;
static int state_fd = -1;
static char state_path[PATH_MAX], events_path[PATH_MAX], fail_init_path[PATH_MAX];

static const char *opt(const char *p) { return p[0] ? p : NULL; }

/* mock-nvml.conf in the directory this library was loaded from. */
static int config_path(char *out, size_t n) {
    const char *env = getenv("MOCK_NVML_CONFIG");
    if (env) {
        snprintf(out, n, "%s", env);
        return 0;
    }
    Dl_info info;
    if (!dladdr((void *)&config_path, &info) || !info.dli_fname) return -1;
    char self[PATH_MAX];
    snprintf(self, sizeof self, "%s", info.dli_fname);
    snprintf(out, n, "%s/mock-nvml.conf", dirname(self));
    return 0;
}

/* ---------- configuration ---------- */

static struct gpu *cur_gpu(void) { return ngpus ? &gpus[ngpus - 1] : NULL; }

static struct profile *profile_by_id(struct gpu *g, unsigned id) {
    for (unsigned i = 0; i < g->nprof; i++)
        if (g->prof[i].present && g->prof[i].id == id) return &g->prof[i];
    return NULL;
}

static struct profile *profile_by_index(struct gpu *g, unsigned index) {
    for (unsigned i = 0; i < g->nprof; i++)
        if (g->prof[i].present && g->prof[i].index == index) return &g->prof[i];
    return NULL;
}

static void rest_of_line(char *dst, size_t n, const char *src) {
    while (*src == ' ') src++;
    snprintf(dst, n, "%s", src);
    size_t l = strlen(dst);
    while (l && (dst[l - 1] == '\n' || dst[l - 1] == '\r')) dst[--l] = 0;
}

static unsigned gi_id_for(struct gpu *g, unsigned start, unsigned size);
static nvmlReturn_t gi_create(struct gpu *g, struct profile *p, unsigned start, unsigned size,
                              struct gi **out);
static nvmlReturn_t ci_create(struct gi *gi, unsigned ci_profile, struct ci **out);

static int load_config(void) {
    char path[PATH_MAX];
    if (config_path(path, sizeof path) != 0) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    gpus = calloc(MAX_GPUS, sizeof(struct gpu));
    if (!gpus) {
        fclose(f);
        return -1;
    }
    ngpus = 0;
    int needs_reset_default = 0;
    char line[512];
    int ok = 1;
    while (ok && fgets(line, sizeof line, f)) {
        int n = 0;
        struct gpu *g = cur_gpu();
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "driver %79s", driver_version) == 1) continue;
        if (sscanf(line, "cuda %d", &cuda_version) == 1) continue;
        if (sscanf(line, "state %4095s", state_path) == 1) continue;
        if (sscanf(line, "events %4095s", events_path) == 1) continue;
        if (sscanf(line, "fail_init_while %4095s", fail_init_path) == 1) continue;
        if (!strncmp(line, "gpu ", 4)) {
            if (ngpus == MAX_GPUS) {
                ok = 0;
                break;
            }
            g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            g->tag = TAG_GPU;
            g->index = ngpus;
            if (sscanf(line,
                       "gpu %u %63s %31s %x %u %u %d %d %llu %d %d %d %u %u %u %n",
                       &g->minor, g->uuid, g->busid, &g->pcidev, &g->brand, &g->arch, &g->ccmaj,
                       &g->ccmin, &g->mem, &g->numa, &g->addr, &g->mig_capable, &g->mig_cur,
                       &g->mem_slices, &g->compute_slices, &n) < 15 ||
                n == 0) {
                ok = 0;
                break;
            }
            g->mig_pend = g->mig_cur;
            g->mig_needs_reset = needs_reset_default;
            rest_of_line(g->name, sizeof g->name, line + n);
            for (unsigned i = 0; i < MAX_GI; i++) {
                g->gi[i].tag = TAG_GI;
                g->gi[i].id = i;
                g->gi[i].gpu = g;
                for (unsigned c = 0; c < MAX_CI; c++) {
                    g->gi[i].ci[c].tag = TAG_CI;
                    g->gi[i].ci[c].id = c;
                    g->gi[i].ci[c].gi = &g->gi[i];
                    g->gi[i].ci[c].mig.tag = TAG_MIG;
                    g->gi[i].ci[c].mig.ci = &g->gi[i].ci[c];
                }
            }
            ngpus++;
            continue;
        }
        if (sscanf(line, "mig_needs_reset %d", &n) == 1) {
            /* Before any gpu line: every GPU; after one: that GPU. */
            if (g) g->mig_needs_reset = n;
            else needs_reset_default = n;
            continue;
        }
        if (!g) {
            ok = 0;
            break;
        }
        if (!strncmp(line, "profile ", 8)) {
            if (g->nprof == MAX_PROFILES) {
                ok = 0;
                break;
            }
            struct profile *p = &g->prof[g->nprof];
            memset(p, 0, sizeof *p);
            if (sscanf(line, "profile %u %u %u %u %u %u %u %u %u %u %llu %n", &p->index, &p->id,
                       &p->slices, &p->instances, &p->mps, &p->ce, &p->dec, &p->enc, &p->jpg,
                       &p->ofa, &p->mem_mb, &n) < 11 ||
                n == 0) {
                ok = 0;
                break;
            }
            rest_of_line(p->name, sizeof p->name, line + n);
            p->present = 1;
            g->nprof++;
            continue;
        }
        unsigned id, start, size;
        char uuid[64];
        if (sscanf(line, "place %u %u %u %63s", &id, &start, &size, uuid) == 4) {
            struct profile *p = profile_by_id(g, id);
            if (!p || p->nplace == MAX_PLACEMENTS) {
                ok = 0;
                break;
            }
            p->place[p->nplace].start = start;
            p->place[p->nplace].size = size;
            snprintf(p->uuid[p->nplace], sizeof p->uuid[0], "%s", uuid);
            p->nplace++;
            continue;
        }
        if (sscanf(line, "gi %u %u", &id, &start) == 2) {
            /* A MIG device that exists at start (static layout): GPU instance + full CI. */
            struct profile *p = profile_by_id(g, id);
            struct gi *gi = NULL;
            struct ci *ci = NULL;
            unsigned k;
            if (!p) {
                ok = 0;
                break;
            }
            for (k = 0; k < p->nplace && p->place[k].start != start; k++);
            if (k == p->nplace || gi_create(g, p, start, p->place[k].size, &gi) != NVML_SUCCESS) {
                ok = 0;
                break;
            }
            static const unsigned ci_for_slices[9] = {0, 0, 1, 2, 3, 0, 6, 4, 5};
            if (ci_create(gi, ci_for_slices[p->slices], &ci) != NVML_SUCCESS) {
                ok = 0;
                break;
            }
            continue;
        }
        ok = 0;
    }
    fclose(f);
    const char *env;
    if ((env = getenv("MOCK_NVML_STATE"))) snprintf(state_path, sizeof state_path, "%s", env);
    if ((env = getenv("MOCK_NVML_EVENTS"))) snprintf(events_path, sizeof events_path, "%s", env);
    if ((env = getenv("MOCK_NVML_FAIL_INIT_WHILE")))
        snprintf(fail_init_path, sizeof fail_init_path, "%s", env);
    if (!ok) {
        fprintf(stderr, "mock-nvml: %s: cannot parse line: %s", path, line);
        free(gpus);
        gpus = NULL;
        ngpus = 0;
        return -1;
    }
    return 0;
}

/* ---------- MIG state shared through MOCK_NVML_STATE ---------- */

static void clear_mig(void) {
    for (unsigned i = 0; i < ngpus; i++)
        for (unsigned k = 0; k < MAX_GI; k++) {
            gpus[i].gi[k].used = 0;
            for (unsigned c = 0; c < MAX_CI; c++) gpus[i].gi[k].ci[c].used = 0;
        }
}

static struct gpu *gpu_by_minor(unsigned minor) {
    for (unsigned i = 0; i < ngpus; i++)
        if (gpus[i].minor == minor) return &gpus[i];
    return NULL;
}

static void load_state(void) {
    if (state_fd < 0) return;
    struct stat st;
    if (fstat(state_fd, &st) != 0 || st.st_size == 0) return; /* nobody saved yet: config's */
    FILE *f = fdopen(dup(state_fd), "r");
    if (!f) return;
    rewind(f);
    clear_mig();
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned minor, a, b, c;
        struct gpu *g;
        if (strcmp(line, "end\n") == 0) break; /* what follows is the tail of a longer old state */
        if (sscanf(line, "gpu %u %u %u", &minor, &a, &b) == 3 && (g = gpu_by_minor(minor))) {
            g->mig_cur = a;
            g->mig_pend = b;
        } else if (sscanf(line, "gi %u %u %u %u", &minor, &a, &b, &c) == 4 &&
                   (g = gpu_by_minor(minor)) && a < MAX_GI) {
            struct profile *p = profile_by_id(g, b);
            if (!p) continue;
            struct gi *gi = &g->gi[a];
            gi->used = 1;
            gi->p = p;
            gi->start = c;
            gi->size = 0;
            for (unsigned k = 0; k < p->nplace; k++)
                if (p->place[k].start == c) gi->size = p->place[k].size;
        } else if (sscanf(line, "ci %u %u %u %u", &minor, &a, &b, &c) == 4 &&
                   (g = gpu_by_minor(minor)) && a < MAX_GI && b < MAX_CI) {
            struct ci *ci = &g->gi[a].ci[b];
            unsigned start = 0;
            if (sscanf(line, "ci %*u %*u %*u %*u %u", &start) != 1) start = 0;
            ci->used = 1;
            ci->profile_id = c;
            static const unsigned slices[8] = {1, 2, 3, 4, 7, 8, 6, 1};
            ci->slices = c < 8 ? slices[c] : 1;
            ci->start = start;
        }
    }
    fclose(f);
}

static void save_state(void) {
    if (state_fd < 0) return;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return;
    for (unsigned i = 0; i < ngpus; i++) {
        struct gpu *g = &gpus[i];
        fprintf(m, "gpu %u %u %u\n", g->minor, g->mig_cur, g->mig_pend);
        for (unsigned k = 0; k < MAX_GI; k++) {
            if (!g->gi[k].used) continue;
            fprintf(m, "gi %u %u %u %u\n", g->minor, k, g->gi[k].p->id, g->gi[k].start);
            for (unsigned c = 0; c < MAX_CI; c++)
                if (g->gi[k].ci[c].used)
                    fprintf(m, "ci %u %u %u %u %u\n", g->minor, k, c, g->gi[k].ci[c].profile_id,
                            g->gi[k].ci[c].start);
        }
    }
    fputs("end\n", m);
    fclose(m);
    /* Overwrite, then cut: a process killed in between (kill -9 of the plugin mid-create) leaves
     * the new state and an ignored tail, never an empty file that would read as a GPU that lost
     * its MIG instances. The state is well under a page, so the write itself is not torn. */
    if (pwrite(state_fd, buf, len, 0) != (ssize_t)len)
        fprintf(stderr, "mock-nvml: short write of the state file\n");
    else if (ftruncate(state_fd, (off_t)len) != 0)
        fprintf(stderr, "mock-nvml: could not truncate the state file\n");
    free(buf);
}

/* Lost GPUs are announced in the events file, so every process sees them. */
static void refresh_lost(void) {
    const char *path = opt(events_path);
    if (!path) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[256];
    unsigned minor;
    while (fgets(line, sizeof line, f)) {
        struct gpu *g;
        if (sscanf(line, "lost %u", &minor) == 1 && (g = gpu_by_minor(minor))) g->lost = 1;
    }
    fclose(f);
}

enum { READ_FACTS, READ_MIG, WRITE_MIG };

/* Every entry point runs between begin() and end(). */
static nvmlReturn_t begin(int mode) {
    pthread_mutex_lock(&mu);
    if (!init_count) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh_lost();
    if (mode != READ_FACTS) {
        const char *path = opt(state_path);
        if (path) {
            state_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (state_fd >= 0) {
                flock(state_fd, mode == WRITE_MIG ? LOCK_EX : LOCK_SH);
                load_state();
            }
        }
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t end(nvmlReturn_t r, int save) {
    if (state_fd >= 0) {
        if (save) save_state();
        flock(state_fd, LOCK_UN);
        close(state_fd);
        state_fd = -1;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---------- handles ---------- */

static struct gpu *as_gpu(nvmlDevice_t d) {
    struct gpu *g = (struct gpu *)d;
    if (!g || g->tag != TAG_GPU) return NULL;
    return g;
}

static struct ci *as_mig(nvmlDevice_t d) {
    unsigned *tag = (unsigned *)d;
    if (!tag || *tag != TAG_MIG) return NULL;
    struct ci *base = (struct ci *)((char *)d - __builtin_offsetof(struct ci, mig));
    return base->used ? base : NULL;
}

static struct gi *as_gi(nvmlGpuInstance_t h) {
    struct gi *gi = (struct gi *)h;
    if (!gi || gi->tag != TAG_GI || !gi->used) return NULL;
    return gi;
}

static struct ci *as_ci(nvmlComputeInstance_t h) {
    struct ci *ci = (struct ci *)h;
    if (!ci || ci->tag != TAG_CI || !ci->used) return NULL;
    return ci;
}

/* A usable GPU handle, or the error NVML gives for it. */
static nvmlReturn_t check_gpu(struct gpu *g) {
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define FACTS(dev, g)                                    \
    nvmlReturn_t r_ = begin(READ_FACTS);                 \
    if (r_) return r_;                                   \
    struct gpu *g = as_gpu(dev);                         \
    if ((r_ = check_gpu(g))) return end(r_, 0);

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---------- library and system ---------- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&mu);
    if (!loaded) {
        if (load_config() != 0) {
            pthread_mutex_unlock(&mu);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        loaded = 1;
        /* The state file starts from the config's MIG devices the first time. */
        const char *path = opt(state_path);
        if (path && (state_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) >= 0) {
            flock(state_fd, LOCK_EX);
            struct stat st;
            if (fstat(state_fd, &st) == 0 && st.st_size == 0) save_state();
            flock(state_fd, LOCK_UN);
            close(state_fd);
            state_fd = -1;
        }
    }
    if (opt(fail_init_path) && access(fail_init_path, F_OK) == 0) {
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    init_count++;
    pthread_mutex_unlock(&mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    nvmlReturn_t r = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count) init_count--;
    pthread_mutex_unlock(&mu);
    return r;
}

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    return end(copy_str(version, length, driver_version), 0);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char v[96];
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    snprintf(v, sizeof v, "%d.%s", cuda_version / 1000, driver_version);
    return end(copy_str(version, length, v), 0);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    if (!v) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *v = cuda_version;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---------- devices ---------- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *count = ngpus;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    if (!device || index >= ngpus) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (gpus[index].lost) return end(NVML_ERROR_GPU_IS_LOST, 0);
    *device = (nvmlDevice_t)&gpus[index];
    return end(NVML_SUCCESS, 0);
}

static const char *mig_uuid(struct ci *ci, char *buf, size_t n) {
    struct gi *gi = ci->gi;
    for (unsigned k = 0; k < gi->p->nplace; k++)
        if (gi->p->place[k].start == gi->start) {
            snprintf(buf, n, "%s", gi->p->uuid[k]);
            /* Further compute instances of the same GPU instance get their own UUIDs. */
            if (ci->id && strlen(buf) > 2) snprintf(buf + strlen(buf) - 2, 3, "%02x", ci->id);
            return buf;
        }
    return "MIG-00000000-0000-0000-0000-000000000000";
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_mig(device);
    if (ci) {
        char buf[64];
        if (ci->gi->gpu->lost) return end(NVML_ERROR_GPU_IS_LOST, 0);
        return end(copy_str(uuid, length, mig_uuid(ci, buf, sizeof buf)), 0);
    }
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    return end(copy_str(uuid, length, g->uuid), 0);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_mig(device);
    if (ci) {
        char buf[200];
        snprintf(buf, sizeof buf, "%s %s", ci->gi->gpu->name, ci->gi->p->name);
        return end(copy_str(name, length, buf), 0);
    }
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    return end(copy_str(name, length, g->name), 0);
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    FACTS(device, g);
    if (!minor) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *minor = g->minor;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    FACTS(device, g);
    if (!pci) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->busid, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, dev, fn);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pcidev;
    pci->pciSubSystemId = (g->pcidev & 0xffff0000u) | 0x10de;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    FACTS(device, g);
    if (!mem) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    mem->total = g->mem;
    mem->used = 0;
    mem->free = g->mem;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    FACTS(device, g);
    if (!mem) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (mem->version != nvmlMemory_v2) return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 0);
    mem->total = g->mem;
    mem->reserved = 0;
    mem->used = 0;
    mem->free = g->mem;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    FACTS(device, g);
    if (!major || !minor) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *major = g->ccmaj;
    *minor = g->ccmin;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *brand) {
    FACTS(device, g);
    if (!brand) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *brand = g->brand;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    FACTS(device, g);
    if (!arch) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *arch = g->arch;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    FACTS(device, g);
    if (!node) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (g->numa < 0) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    *node = (unsigned)g->numa;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode) {
    FACTS(device, g);
    if (!mode) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (mode->version != nvmlDeviceAddressingMode_v1)
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 0);
    if (g->addr < 0) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    mode->value = (unsigned)g->addr;
    return end(NVML_SUCCESS, 0);
}

/* ---------- compute mode (not persisted: it resets with the driver, like the real one) ---------- */

API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode) {
    FACTS(device, g);
    if (!mode) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *mode = g->compute_mode;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, unsigned int mode) {
    FACTS(device, g);
    if (mode > 3) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    g->compute_mode = mode;
    return end(NVML_SUCCESS, 0);
}

/* ---------- MIG mode ---------- */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!current || !pending) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    *current = g->mig_cur;
    *pending = g->mig_pend;
    return end(NVML_SUCCESS, 0);
}

static int gi_count(struct gpu *g) {
    int n = 0;
    for (unsigned k = 0; k < MAX_GI; k++) n += g->gi[k].used;
    return n;
}

API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                      nvmlReturn_t *activationStatus) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!activationStatus || mode > 1) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    if (mode == 0 && gi_count(g)) return end(NVML_ERROR_IN_USE, 0);
    g->mig_pend = mode;
    if (g->mig_needs_reset && g->mig_cur != mode) {
        *activationStatus = NVML_ERROR_IN_USE; /* pending until the GPU is reset */
    } else {
        g->mig_cur = mode;
        *activationStatus = NVML_SUCCESS;
    }
    return end(NVML_SUCCESS, 1);
}

/* ---------- GPU instances ---------- */

static void fill_gi_profile(struct profile *p, unsigned *id, unsigned *slices, unsigned *count,
                            unsigned *mps, unsigned *ce, unsigned *dec, unsigned *enc,
                            unsigned *jpg, unsigned *ofa, unsigned long long *mem) {
    *id = p->id;
    *slices = p->slices;
    *count = p->instances;
    *mps = p->mps;
    *ce = p->ce;
    *dec = p->dec;
    *enc = p->enc;
    *jpg = p->jpg;
    *ofa = p->ofa;
    *mem = p->mem_mb;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info) {
    FACTS(device, g);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_index(g, profile);
    if (!p) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    memset(info, 0, sizeof *info);
    fill_gi_profile(p, &info->id, &info->sliceCount, &info->instanceCount,
                    &info->multiprocessorCount, &info->copyEngineCount, &info->decoderCount,
                    &info->encoderCount, &info->jpegCount, &info->ofaCount, &info->memorySizeMB);
    info->isP2pSupported = 0;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                      void *vinfo) {
    FACTS(device, g);
    if (!vinfo || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_index(g, profile);
    if (!p) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    unsigned version = *(unsigned *)vinfo;
    if (version == nvmlGpuInstanceProfileInfo_v2) {
        nvmlGpuInstanceProfileInfo_v2_t *i = vinfo;
        memset(i, 0, sizeof *i);
        i->version = version;
        fill_gi_profile(p, &i->id, &i->sliceCount, &i->instanceCount, &i->multiprocessorCount,
                        &i->copyEngineCount, &i->decoderCount, &i->encoderCount, &i->jpegCount,
                        &i->ofaCount, &i->memorySizeMB);
        snprintf(i->name, sizeof i->name, "MIG %s", p->name);
    } else if (version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *i = vinfo;
        memset(i, 0, sizeof *i);
        i->version = version;
        fill_gi_profile(p, &i->id, &i->sliceCount, &i->instanceCount, &i->multiprocessorCount,
                        &i->copyEngineCount, &i->decoderCount, &i->encoderCount, &i->jpegCount,
                        &i->ofaCount, &i->memorySizeMB);
        snprintf(i->name, sizeof i->name, "MIG %s", p->name);
        i->capabilities = strstr(p->name, "+gfx") ? 2 : 0;
    } else {
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 0);
    }
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count) {
    FACTS(device, g);
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_id(g, profileId);
    if (!p) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!placements) {
        *count = p->nplace;
        return end(NVML_SUCCESS, 0);
    }
    if (*count < p->nplace) {
        *count = p->nplace;
        return end(NVML_ERROR_INSUFFICIENT_SIZE, 0);
    }
    memcpy(placements, p->place, p->nplace * sizeof p->place[0]);
    *count = p->nplace;
    return end(NVML_SUCCESS, 0);
}

/* GPU instance IDs follow the hardware's swizzle: a binary tree over the memory slices. */
static unsigned gi_id_for(struct gpu *g, unsigned start, unsigned size) {
    if (size && g->mem_slices % size == 0) {
        unsigned id = g->mem_slices / size - 1 + start / size;
        if (id < MAX_GI && !g->gi[id].used) return id;
    }
    for (unsigned k = 1; k < MAX_GI; k++)
        if (!g->gi[k].used) return k;
    return MAX_GI;
}

static nvmlReturn_t gi_create(struct gpu *g, struct profile *p, unsigned start, unsigned size,
                              struct gi **out) {
    unsigned same = 0, compute = 0;
    for (unsigned k = 0; k < MAX_GI; k++) {
        struct gi *o = &g->gi[k];
        if (!o->used) continue;
        if (o->p == p) same++;
        compute += o->p->slices;
        if (start < o->start + o->size && o->start < start + size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (same >= p->instances || compute + p->slices > g->compute_slices)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned id = gi_id_for(g, start, size);
    if (id >= MAX_GI) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    struct gi *gi = &g->gi[id];
    gi->used = 1;
    gi->p = p;
    gi->start = start;
    gi->size = size;
    for (unsigned c = 0; c < MAX_CI; c++) gi->ci[c].used = 0;
    *out = gi;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!placement || !gpuInstance) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable || g->mig_cur != 1) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_id(g, profileId);
    if (!p) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned k;
    for (k = 0; k < p->nplace; k++)
        if (p->place[k].start == placement->start && p->place[k].size == placement->size) break;
    if (k == p->nplace) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    struct gi *gi;
    r = gi_create(g, p, placement->start, placement->size, &gi);
    if (r) return end(r, 0);
    *gpuInstance = (nvmlGpuInstance_t)gi;
    return end(NVML_SUCCESS, 1);
}

API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                             nvmlGpuInstance_t *gpuInstance) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!gpuInstance) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable || g->mig_cur != 1) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_id(g, profileId);
    if (!p) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    for (unsigned k = 0; k < p->nplace && r; k++) {
        struct gi *gi;
        r = gi_create(g, p, p->place[k].start, p->place[k].size, &gi);
        if (!r) *gpuInstance = (nvmlGpuInstance_t)gi;
    }
    return end(r, r == NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (gi->gpu->lost) return end(NVML_ERROR_GPU_IS_LOST, 0);
    for (unsigned c = 0; c < MAX_CI; c++)
        if (gi->ci[c].used) return end(NVML_ERROR_IN_USE, 0);
    gi->used = 0;
    return end(NVML_SUCCESS, 1);
}

API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                           nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!count || !gpuInstances) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable || g->mig_cur != 1) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    struct profile *p = profile_by_id(g, profileId);
    if (!p) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    unsigned n = 0;
    for (unsigned k = 0; k < MAX_GI; k++)
        if (g->gi[k].used && g->gi[k].p == p) n++;
    if (*count < n) {
        *count = n;
        return end(NVML_ERROR_INSUFFICIENT_SIZE, 0);
    }
    n = 0;
    for (unsigned k = 0; k < MAX_GI; k++)
        if (g->gi[k].used && g->gi[k].p == p) gpuInstances[n++] = (nvmlGpuInstance_t)&g->gi[k];
    *count = n;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                              nvmlGpuInstance_t *gpuInstance) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!gpuInstance) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (id >= MAX_GI || !g->gi[id].used) return end(NVML_ERROR_NOT_FOUND, 0);
    *gpuInstance = (nvmlGpuInstance_t)&g->gi[id];
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                        nvmlGpuInstanceInfo_t *info) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi || !info) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    info->device = (nvmlDevice_t)gi->gpu;
    info->id = gi->id;
    info->profileId = gi->p->id;
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    return end(NVML_SUCCESS, 0);
}

/* ---------- compute instances ---------- */

static const unsigned ci_slices[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 1};

static int ci_supported(struct gi *gi, unsigned profile) {
    return profile < NVML_COMPUTE_INSTANCE_PROFILE_COUNT && profile != 7 && profile != 6 &&
           ci_slices[profile] <= gi->p->slices;
}

static void fill_ci_profile(struct gi *gi, unsigned profile, unsigned *id, unsigned *slices,
                            unsigned *count, unsigned *mps, unsigned *ce, unsigned *dec,
                            unsigned *enc, unsigned *jpg, unsigned *ofa) {
    unsigned s = ci_slices[profile], total = gi->p->slices;
    *id = profile;
    *slices = s;
    *count = total / s;
    *mps = gi->p->mps * s / total;
    *ce = gi->p->ce;
    *dec = gi->p->dec;
    *enc = gi->p->enc;
    *jpg = gi->p->jpg;
    *ofa = gi->p->ofa;
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi || !info || engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!ci_supported(gi, profile)) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    fill_ci_profile(gi, profile, &info->id, &info->sliceCount, &info->instanceCount,
                    &info->multiprocessorCount, &info->sharedCopyEngineCount,
                    &info->sharedDecoderCount, &info->sharedEncoderCount, &info->sharedJpegCount,
                    &info->sharedOfaCount);
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                               unsigned int profile,
                                                               unsigned int engProfile,
                                                               void *vinfo) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi || !vinfo || engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!ci_supported(gi, profile)) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    unsigned version = *(unsigned *)vinfo;
    /* v2 and v3 share their prefix; v3 adds capabilities after the name. */
    if (version != nvmlComputeInstanceProfileInfo_v2 &&
        version != nvmlComputeInstanceProfileInfo_v3)
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 0);
    nvmlComputeInstanceProfileInfo_v2_t *i = vinfo;
    memset(i, 0, version == nvmlComputeInstanceProfileInfo_v3
                     ? sizeof(nvmlComputeInstanceProfileInfo_v3_t)
                     : sizeof *i);
    i->version = version;
    fill_ci_profile(gi, profile, &i->id, &i->sliceCount, &i->instanceCount,
                    &i->multiprocessorCount, &i->sharedCopyEngineCount, &i->sharedDecoderCount,
                    &i->sharedEncoderCount, &i->sharedJpegCount, &i->sharedOfaCount);
    if (ci_slices[profile] == gi->p->slices)
        snprintf(i->name, sizeof i->name, "MIG %s", gi->p->name);
    else
        snprintf(i->name, sizeof i->name, "MIG %uc.%s", ci_slices[profile], gi->p->name);
    return end(NVML_SUCCESS, 0);
}

static nvmlReturn_t ci_create(struct gi *gi, unsigned profile, struct ci **out) {
    if (!ci_supported(gi, profile)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned used = 0, same = 0, free_id = MAX_CI;
    for (unsigned c = 0; c < MAX_CI; c++) {
        if (gi->ci[c].used) {
            used += gi->ci[c].slices;
            same += gi->ci[c].profile_id == profile;
        } else if (free_id == MAX_CI) {
            free_id = c;
        }
    }
    unsigned s = ci_slices[profile];
    if (free_id == MAX_CI || used + s > gi->p->slices || same >= gi->p->slices / s)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    struct ci *ci = &gi->ci[free_id];
    ci->used = 1;
    ci->profile_id = profile;
    ci->slices = s;
    ci->start = used;
    *out = ci;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                      unsigned int profileId,
                                                      nvmlComputeInstance_t *computeInstance) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi || !computeInstance) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (gi->gpu->lost) return end(NVML_ERROR_GPU_IS_LOST, 0);
    struct ci *ci;
    r = ci_create(gi, profileId, &ci);
    if (r) return end(r, 0);
    *computeInstance = (nvmlComputeInstance_t)ci;
    return end(NVML_SUCCESS, 1);
}

API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    nvmlReturn_t r = begin(WRITE_MIG);
    if (r) return r;
    struct ci *ci = as_ci(computeInstance);
    if (!ci) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    ci->used = 0;
    return end(NVML_SUCCESS, 1);
}

API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                    unsigned int profileId,
                                                    nvmlComputeInstance_t *computeInstances,
                                                    unsigned int *count) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gi *gi = as_gi(gpuInstance);
    if (!gi || !count || !computeInstances) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!ci_supported(gi, profileId)) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    unsigned n = 0;
    for (unsigned c = 0; c < MAX_CI; c++) n += gi->ci[c].used && gi->ci[c].profile_id == profileId;
    if (*count < n) {
        *count = n;
        return end(NVML_ERROR_INSUFFICIENT_SIZE, 0);
    }
    n = 0;
    for (unsigned c = 0; c < MAX_CI; c++)
        if (gi->ci[c].used && gi->ci[c].profile_id == profileId)
            computeInstances[n++] = (nvmlComputeInstance_t)&gi->ci[c];
    *count = n;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                               nvmlComputeInstanceInfo_t *info) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_ci(computeInstance);
    if (!ci || !info) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    info->device = (nvmlDevice_t)ci->gi->gpu;
    info->gpuInstance = (nvmlGpuInstance_t)ci->gi;
    info->id = ci->id;
    info->profileId = ci->profile_id;
    info->placement.start = ci->start;
    info->placement.size = ci->slices;
    return end(NVML_SUCCESS, 0);
}

/* ---------- MIG devices ---------- */

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    FACTS(device, g);
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *count = g->mig_capable ? g->compute_slices : 0;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *migDevice) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct gpu *g = as_gpu(device);
    if ((r = check_gpu(g))) return end(r, 0);
    if (!migDevice) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!g->mig_capable || g->mig_cur != 1) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    unsigned n = 0;
    for (unsigned k = 0; k < MAX_GI; k++) {
        if (!g->gi[k].used) continue;
        for (unsigned c = 0; c < MAX_CI; c++) {
            if (!g->gi[k].ci[c].used) continue;
            if (n++ == index) {
                *migDevice = (nvmlDevice_t)&g->gi[k].ci[c].mig;
                return end(NVML_SUCCESS, 0);
            }
        }
    }
    return end(NVML_ERROR_NOT_FOUND, 0);
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    if (!isMigDevice) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (as_mig(device)) *isMigDevice = 1;
    else if (as_gpu(device)) *isMigDevice = 0;
    else return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                              nvmlDevice_t *device) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_mig(migDevice);
    if (!ci || !device) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *device = (nvmlDevice_t)ci->gi->gpu;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_mig(device);
    if (!id) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!ci) return end(as_gpu(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT, 0);
    *id = ci->gi->id;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t r = begin(READ_MIG);
    if (r) return r;
    struct ci *ci = as_mig(device);
    if (!id) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (!ci) return end(as_gpu(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT, 0);
    *id = ci->id;
    return end(NVML_SUCCESS, 0);
}

/* ---------- events ---------- */

#define SUPPORTED_EVENTS \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError)

static long events_size(void) {
    const char *path = opt(events_path);
    struct stat st;
    if (!path || stat(path, &st) != 0) return 0;
    return (long)st.st_size;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = begin(READ_FACTS);
    if (r) return r;
    if (!set) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    struct evset *s = calloc(1, sizeof *s);
    if (!s) return end(NVML_ERROR_MEMORY, 0);
    s->tag = TAG_SET;
    s->offset = events_size(); /* only events injected from now on */
    *set = (nvmlEventSet_t)s;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    struct evset *s = (struct evset *)set;
    if (!s || s->tag != TAG_SET) return NVML_ERROR_INVALID_ARGUMENT;
    s->tag = 0;
    free(s);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                  unsigned long long *eventTypes) {
    FACTS(device, g);
    (void)g;
    if (!eventTypes) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    *eventTypes = SUPPORTED_EVENTS;
    return end(NVML_SUCCESS, 0);
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                          nvmlEventSet_t set) {
    FACTS(device, g);
    struct evset *s = (struct evset *)set;
    if (!s || s->tag != TAG_SET) return end(NVML_ERROR_INVALID_ARGUMENT, 0);
    if (eventTypes & ~SUPPORTED_EVENTS) return end(NVML_ERROR_NOT_SUPPORTED, 0);
    s->mask[g->index] |= eventTypes;
    return end(NVML_SUCCESS, 0);
}

/* One pass over the events appended since the set's offset; 1 when an event was delivered. */
static int next_event(struct evset *s, nvmlEventData_t *data, nvmlReturn_t *ret) {
    const char *path = opt(events_path);
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int delivered = 0;
    char line[256];
    if (fseek(f, s->offset, SEEK_SET) == 0) {
        while (!delivered && fgets(line, sizeof line, f)) {
            size_t l = strlen(line);
            if (!l || line[l - 1] != '\n') break; /* a line still being written */
            s->offset += (long)l;
            unsigned minor, gi = 0xffffffffu, ci = 0xffffffffu;
            unsigned long long code = 0, type = 0;
            char kind[16];
            if (sscanf(line, "%15s %u", kind, &minor) != 2) continue;
            struct gpu *g = gpu_by_minor(minor);
            if (!g || !s->mask[g->index]) continue;
            if (!strcmp(kind, "lost")) {
                g->lost = 1;
                *ret = NVML_ERROR_GPU_IS_LOST;
                delivered = 1;
                break;
            }
            if (!strcmp(kind, "xid")) {
                type = nvmlEventTypeXidCriticalError;
                sscanf(line, "%*s %*u %llu %u %u", &code, &gi, &ci);
            } else if (!strcmp(kind, "dbe")) {
                type = nvmlEventTypeDoubleBitEccError;
            } else if (!strcmp(kind, "sbe")) {
                type = nvmlEventTypeSingleBitEccError;
            }
            if (!(s->mask[g->index] & type)) continue;
            memset(data, 0, sizeof *data);
            data->device = (nvmlDevice_t)g;
            data->eventType = type;
            data->eventData = code;
            data->gpuInstanceId = gi;
            data->computeInstanceId = ci;
            *ret = NVML_SUCCESS;
            delivered = 1;
        }
    }
    fclose(f);
    return delivered;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    struct evset *s = (struct evset *)set;
    if (!s || s->tag != TAG_SET || !data) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        nvmlReturn_t r = begin(READ_FACTS);
        if (r) return r;
        nvmlReturn_t ret = NVML_SUCCESS;
        int got = next_event(s, data, &ret);
        end(NVML_SUCCESS, 0);
        if (got) return ret;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= (long)timeoutms) return NVML_ERROR_TIMEOUT;
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                  unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
