/*
 * devbuf_none.c - a build without CUDA (--without-cuda, or no cuda.h at
 * configure time): every pointer is host memory and the _stream forms say
 * why they cannot work.
 */
#include "devbuf.h"

bool weft_dev_on_device(struct weft_comm *comm, const void *a, const void *b)
{
    return false;
}

weft_status_t weft_dev_call(struct weft_comm *comm, const struct weft_op_args *a, bool has_stream,
                            void *stream, const char *fn, bool in_group)
{
    return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_UNSUPPORTED,
                            "%s: this weft was built without CUDA (configure --with-cuda)", fn);
}

weft_status_t weft_dev_group_end(void)
{
    return WEFT_OK;
}

weft_status_t weft_dev_drain(struct weft_comm *comm)
{
    return WEFT_OK;
}

void weft_dev_abort(struct weft_comm *comm)
{
}

void weft_dev_destroy(struct weft_comm *comm)
{
}

void weft_dev_stats(struct weft_comm *comm, uint64_t *ipc, uint64_t *staged)
{
    *ipc = *staged = 0;
}

int weft_cuda_device_count(void)
{
    return 0;
}
