/* The C side of OrionFS's libfabric bindings.
 *
 * libfabric's data-path calls (fi_read, fi_cq_read, fi_mr_key, ...) are static inline functions
 * in its headers, so Rust cannot link against them; each gets a one-line exported wrapper here.
 * fi_info setup also lives here because it pokes nested structures whose layout Rust would have
 * to mirror by hand. Everything crossing into Rust is an opaque pointer or a scalar.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

/* libfabric is opened on first use rather than linked: loading it runs the library
 * constructors of the providers it links (Debian's psm and psm2 ones calibrate timers for
 * about 200 ms), which every orion process and every program under the preload library would
 * otherwise pay at start, even when it speaks only the shared-memory fabric. The data-path
 * calls need no symbol (they go through the objects' operation tables); these five do. */
static struct {
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                   struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
    int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
    const char *(*strerror)(int);
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static int lib_loaded;
static char lib_error[256];

static void lib_open(void) {
    void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lib_error, sizeof lib_error, "libfabric could not be loaded (%s)", dlerror());
        return;
    }
    lib.getinfo = dlsym(h, "fi_getinfo");
    lib.freeinfo = dlsym(h, "fi_freeinfo");
    lib.dupinfo = dlsym(h, "fi_dupinfo");
    lib.fabric = dlsym(h, "fi_fabric");
    lib.strerror = dlsym(h, "fi_strerror");
    lib_loaded = lib.getinfo && lib.freeinfo && lib.dupinfo && lib.fabric && lib.strerror;
    if (!lib_loaded)
        snprintf(lib_error, sizeof lib_error, "libfabric.so.1 lacks a function OrionFS calls");
}

/* Whether libfabric is loaded (opening it on the first call). */
static int lib_ready(void) {
    pthread_once(&lib_once, lib_open);
    return lib_loaded;
}

/* One completion as Rust sees it. */
struct orion_cqe {
    uint64_t context;
    uint64_t flags;
    uint64_t len;
    uint64_t data;
};

struct orion_cqerr {
    uint64_t context;
    uint64_t flags;
    uint64_t len;
    uint64_t olen;
    int32_t err;
    int32_t prov_errno;
    char msg[128];
};

struct orion_info_attrs {
    uint64_t mr_mode;
    uint64_t mr_key_size;
    uint64_t cq_data_size;
    uint64_t max_msg_size;
    uint64_t inject_size;
    uint64_t tx_size;
    uint64_t rx_size;
    char provider[64];
    char fabric[64];
    char domain[64];
};

uint32_t orion_fi_api_version(void) { return FI_VERSION(1, 17); }
const char *orion_fi_strerror(int err) {
    return lib_ready() ? lib.strerror(err) : lib_error;
}

/* The memory-registration modes an RDMA provider may require; the provider keeps the ones it
 * needs and drops the rest, and the Rust side honours what comes back. */
uint64_t orion_fi_requested_mr_mode(void) {
    return FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
}

int orion_fi_getinfo(const char *provider, const char *node, struct fi_info **out) {
    if (!lib_ready()) return -FI_ENOSYS;
    struct fi_info *hints = lib.dupinfo(NULL);
    if (!hints) return -FI_ENOMEM;
    hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_SEND | FI_RECV | FI_REMOTE_READ |
                  FI_REMOTE_WRITE;
    hints->mode = 0;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = (int)orion_fi_requested_mr_mode();
    hints->domain_attr->threading = FI_THREAD_SAFE;
    /* The file system relies on these orders on one connection: messages in order, a commit
     * message after the data it names (send after write), read-after-write and
     * write-after-write on the same target. */
    hints->tx_attr->msg_order = FI_ORDER_SAS | FI_ORDER_SAW | FI_ORDER_RAW | FI_ORDER_WAW;
    hints->rx_attr->msg_order = hints->tx_attr->msg_order;
    /* A completion means the target placed (or refused) the data, as an RDMA RC write's
     * completion follows the remote NIC's acknowledgment; without it, tcp completes a write as
     * soon as it is sent and a refused access would look successful. */
    hints->tx_attr->op_flags = FI_COMPLETION | FI_DELIVERY_COMPLETE;
    hints->rx_attr->op_flags = FI_COMPLETION;
    hints->addr_format = FI_SOCKADDR_IN;
    if (provider && provider[0]) {
        hints->fabric_attr->prov_name = strdup(provider);
    }
    int ret = lib.getinfo(orion_fi_api_version(), node, NULL, node ? FI_SOURCE : 0, hints, out);
    lib.freeinfo(hints);
    return ret;
}

void orion_fi_info_attrs(const struct fi_info *info, struct orion_info_attrs *a) {
    memset(a, 0, sizeof(*a));
    a->mr_mode = (uint64_t)info->domain_attr->mr_mode;
    a->mr_key_size = info->domain_attr->mr_key_size;
    a->cq_data_size = info->domain_attr->cq_data_size;
    a->max_msg_size = info->ep_attr->max_msg_size;
    a->inject_size = info->tx_attr->inject_size;
    a->tx_size = info->tx_attr->size;
    a->rx_size = info->rx_attr->size;
    if (info->fabric_attr->prov_name)
        strncpy(a->provider, info->fabric_attr->prov_name, sizeof(a->provider) - 1);
    if (info->fabric_attr->name)
        strncpy(a->fabric, info->fabric_attr->name, sizeof(a->fabric) - 1);
    if (info->domain_attr->name)
        strncpy(a->domain, info->domain_attr->name, sizeof(a->domain) - 1);
}

void orion_fi_freeinfo(struct fi_info *info) { lib.freeinfo(info); }

int orion_fi_fabric(struct fi_info *info, struct fid_fabric **fabric) {
    return lib.fabric(info->fabric_attr, fabric, NULL);
}

int orion_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain) {
    return fi_domain(fabric, info, domain, NULL);
}

int orion_fi_av_open(struct fid_domain *domain, struct fid_av **av) {
    struct fi_av_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.type = FI_AV_TABLE;
    return fi_av_open(domain, &attr, av, NULL);
}

int orion_fi_cq_open(struct fid_domain *domain, size_t size, int with_wait_fd, struct fid_cq **cq) {
    struct fi_cq_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = size;
    attr.format = FI_CQ_FORMAT_DATA;
    attr.wait_obj = with_wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
    return fi_cq_open(domain, &attr, cq, NULL);
}

int orion_fi_cq_wait_fd(struct fid_cq *cq, int *fd) {
    return fi_control(&cq->fid, FI_GETWAIT, fd);
}

/* Before sleeping on a wait fd libfabric must be asked whether that is safe right now. */
int orion_fi_trywait(struct fid_fabric *fabric, struct fid_cq *cq) {
    struct fid *fids[1] = {&cq->fid};
    return fi_trywait(fabric, fids, 1);
}

/* An RDM endpoint bound to its own completion queue and the domain's address vector. The
 * source address pins it to the node's fabric address (port chosen by the kernel). */
int orion_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_av *av,
                      struct fid_cq *cq, struct fid_ep **ep) {
    int ret = fi_endpoint(domain, info, ep, NULL);
    if (ret) return ret;
    ret = fi_ep_bind(*ep, &av->fid, 0);
    if (!ret) ret = fi_ep_bind(*ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (!ret) ret = fi_enable(*ep);
    if (ret) {
        fi_close(&(*ep)->fid);
        *ep = NULL;
    }
    return ret;
}

int orion_fi_getname(struct fid_ep *ep, void *buf, size_t *len) {
    return fi_getname(&ep->fid, buf, len);
}

int orion_fi_av_insert(struct fid_av *av, const void *addr, uint64_t *fi_addr) {
    fi_addr_t out = FI_ADDR_NOTAVAIL;
    int n = fi_av_insert(av, addr, 1, &out, 0, NULL);
    if (n != 1) return n < 0 ? n : -FI_EINVAL;
    *fi_addr = out;
    return 0;
}

int orion_fi_av_remove(struct fid_av *av, uint64_t fi_addr) {
    fi_addr_t a = fi_addr;
    return fi_av_remove(av, &a, 1, 0);
}

int orion_fi_mr_reg(struct fid_domain *domain, void *buf, size_t len, uint64_t access,
                    uint64_t requested_key, struct fid_mr **mr) {
    return fi_mr_reg(domain, buf, len, access, 0, requested_key, 0, mr, NULL);
}
uint64_t orion_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *orion_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

int orion_fi_close_ep(struct fid_ep *ep) { return fi_close(&ep->fid); }
int orion_fi_close_cq(struct fid_cq *cq) { return fi_close(&cq->fid); }
int orion_fi_close_av(struct fid_av *av) { return fi_close(&av->fid); }
int orion_fi_close_mr(struct fid_mr *mr) { return fi_close(&mr->fid); }
int orion_fi_close_domain(struct fid_domain *d) { return fi_close(&d->fid); }
int orion_fi_close_fabric(struct fid_fabric *f) { return fi_close(&f->fid); }

ssize_t orion_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t dest,
                      uint64_t ctx) {
    return fi_send(ep, buf, len, desc, dest, (void *)(uintptr_t)ctx);
}
ssize_t orion_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, uint64_t src,
                      uint64_t ctx) {
    return fi_recv(ep, buf, len, desc, src, (void *)(uintptr_t)ctx);
}
ssize_t orion_fi_read(struct fid_ep *ep, void *buf, size_t len, void *desc, uint64_t src,
                      uint64_t addr, uint64_t key, uint64_t ctx) {
    return fi_read(ep, buf, len, desc, src, addr, key, (void *)(uintptr_t)ctx);
}
ssize_t orion_fi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t dest,
                       uint64_t addr, uint64_t key, uint64_t ctx) {
    return fi_write(ep, buf, len, desc, dest, addr, key, (void *)(uintptr_t)ctx);
}
ssize_t orion_fi_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                           uint64_t data, uint64_t dest, uint64_t addr, uint64_t key,
                           uint64_t ctx) {
    return fi_writedata(ep, buf, len, desc, data, dest, addr, key, (void *)(uintptr_t)ctx);
}

static void copy_entries(const struct fi_cq_data_entry *in, struct orion_cqe *out, ssize_t n) {
    for (ssize_t i = 0; i < n; i++) {
        out[i].context = (uint64_t)(uintptr_t)in[i].op_context;
        out[i].flags = in[i].flags;
        out[i].len = in[i].len;
        out[i].data = in[i].data;
    }
}

ssize_t orion_fi_cq_read(struct fid_cq *cq, struct orion_cqe *out, size_t count) {
    struct fi_cq_data_entry buf[64];
    if (count > 64) count = 64;
    ssize_t n = fi_cq_read(cq, buf, count);
    if (n > 0) copy_entries(buf, out, n);
    return n;
}

ssize_t orion_fi_cq_sread(struct fid_cq *cq, struct orion_cqe *out, size_t count, int timeout_ms) {
    struct fi_cq_data_entry buf[64];
    if (count > 64) count = 64;
    ssize_t n = fi_cq_sread(cq, buf, count, NULL, timeout_ms);
    if (n > 0) copy_entries(buf, out, n);
    return n;
}

ssize_t orion_fi_cq_readerr(struct fid_cq *cq, struct orion_cqerr *out) {
    struct fi_cq_err_entry e;
    memset(&e, 0, sizeof(e));
    ssize_t n = fi_cq_readerr(cq, &e, 0);
    if (n <= 0) return n;
    memset(out, 0, sizeof(*out));
    out->context = (uint64_t)(uintptr_t)e.op_context;
    out->flags = e.flags;
    out->len = e.len;
    out->olen = e.olen;
    out->err = e.err;
    out->prov_errno = e.prov_errno;
    const char *s = fi_cq_strerror(cq, e.prov_errno, e.err_data, NULL, 0);
    if (s) strncpy(out->msg, s, sizeof(out->msg) - 1);
    return n;
}

uint64_t orion_fi_flag_recv(void) { return FI_RECV; }
uint64_t orion_fi_flag_send(void) { return FI_SEND; }
uint64_t orion_fi_flag_read(void) { return FI_READ; }
uint64_t orion_fi_flag_write(void) { return FI_WRITE; }
uint64_t orion_fi_flag_remote_write(void) { return FI_REMOTE_WRITE; }
uint64_t orion_fi_flag_remote_cq_data(void) { return FI_REMOTE_CQ_DATA; }
uint64_t orion_fi_access_local(void) { return FI_SEND | FI_RECV | FI_READ | FI_WRITE; }
uint64_t orion_fi_access_remote_read(void) { return FI_REMOTE_READ; }
uint64_t orion_fi_access_remote_write(void) { return FI_REMOTE_WRITE; }
