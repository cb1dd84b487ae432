/*
 * process_group_weft.cpp - torch.distributed's "weft" backend: a
 * c10d::ProcessGroup whose collectives are weft's non-blocking calls on CPU
 * tensors, finished in issue order by one completion thread per group.
 */
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <weft.h>

namespace {

using c10d::OpType;

const char kIdKey[] = "weft_unique_id";

/* Every message starts "weft rank R:" so a log of many ranks says who failed. */
[[noreturn]] void fail(int rank, const std::string &what)
{
    throw std::runtime_error("weft rank " + std::to_string(rank) + ": " + what);
}

std::string status_text(weft_status_t st, const char *last)
{
    std::string s = weft_status_string(st);
    if (last != nullptr && last[0] != '\0')
        s += std::string(": ") + last;
    return s;
}

/* The dtypes torch and weft share; the arithmetic ones may be reduced. */
bool weft_dtype_of(at::ScalarType t, weft_dtype_t *out)
{
    switch (t) {
    case at::kFloat: *out = WEFT_FLOAT32; return true;
    case at::kDouble: *out = WEFT_FLOAT64; return true;
    case at::kHalf: *out = WEFT_FLOAT16; return true;
    case at::kBFloat16: *out = WEFT_BFLOAT16; return true;
    case at::kChar: *out = WEFT_INT8; return true;
    case at::kByte: *out = WEFT_UINT8; return true;
    case at::kInt: *out = WEFT_INT32; return true;
    case at::kLong: *out = WEFT_INT64; return true;
    default: return false;
    }
}

weft_op_t weft_op_of(int rank, const c10d::ReduceOp &op, at::ScalarType t)
{
    /* A bool is a byte holding 0 or 1: MIN is logical and, MAX logical or;
     * a sum or product could leave other values in it. */
    if (t == at::kBool && op.op_ != c10d::ReduceOp::MIN && op.op_ != c10d::ReduceOp::MAX)
        fail(rank, "bool tensors reduce with MIN or MAX only");
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return WEFT_SUM;
    case c10d::ReduceOp::AVG: return WEFT_AVG;
    case c10d::ReduceOp::PRODUCT: return WEFT_PROD;
    case c10d::ReduceOp::MIN: return WEFT_MIN;
    case c10d::ReduceOp::MAX: return WEFT_MAX;
    default:
        fail(rank, "reduction op " + std::to_string((int)op.op_) +
                       " is not supported (weft has SUM, AVG, PRODUCT, MIN, MAX)");
    }
}

/* Element type and count weft sees for a tensor that is only moved: any
 * dtype weft lacks (int16, complex, bool) travels as its bytes. */
std::pair<weft_dtype_t, size_t> moved_as(const at::Tensor &t)
{
    weft_dtype_t dt;
    if (weft_dtype_of(t.scalar_type(), &dt))
        return {dt, (size_t)t.numel()};
    return {WEFT_UINT8, (size_t)t.nbytes()};
}

/* Element type and count for a tensor that is reduced. */
std::pair<weft_dtype_t, size_t> reduced_as(int rank, const at::Tensor &t)
{
    weft_dtype_t dt;
    if (t.scalar_type() == at::kBool)
        return {WEFT_UINT8, (size_t)t.numel()};
    if (!weft_dtype_of(t.scalar_type(), &dt))
        fail(rank, std::string("dtype ") + c10::toString(t.scalar_type()) +
                       " cannot be reduced (weft reduces float32/64/16, bfloat16, int8/32/64, "
                       "uint8)");
    return {dt, (size_t)t.numel()};
}

/*
 * One operation handed to weft.  Owns what weft borrows (contiguous copies,
 * flat staging buffers) until the request completes, then copies staged
 * results out (copy_back), finishes the Work and completes the future with
 * the output tensors, the value DDP's reducer reads.
 */
class WeftWork : public c10d::Work {
public:
    WeftWork(int rank, OpType type, std::vector<at::Tensor> outputs)
        : c10d::Work(rank, type), outputs_(std::move(outputs)),
          future_(c10::make_intrusive<at::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

    /* Called once, by the completion thread. */
    void complete(std::exception_ptr e)
    {
        if (!e) {
            try {
                for (auto &cb : copy_back_)
                    cb.first.copy_(cb.second);
            } catch (...) {
                e = std::current_exception();
            }
        }
        keep_.clear();
        copy_back_.clear();
        finish(e);
        if (e)
            future_->setError(e);
        else
            future_->markCompleted(c10::IValue(outputs_));
    }

    std::vector<at::Tensor> keep_;                              /* borrowed by weft */
    std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_; /* (dst, staged src) */

private:
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<at::ivalue::Future> future_;
};

/*
 * The process group.  Invariant: queue_ holds the requests in the order
 * they were issued to comm_ (issue and push happen under mu_), which is the
 * order weft completes them, so the completion thread waits on the head
 * only.  The destructor drains the queue before it frees comm_.
 */
class ProcessGroupWeft : public c10d::ProcessGroup {
public:
    ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size)
        : c10d::ProcessGroup(rank, size)
    {
        weft_unique_id_t id;
        if (rank == 0) {
            weft_status_t st = weft_get_unique_id(&id);
            if (st != WEFT_OK)
                fail(rank, "weft_get_unique_id failed: " + status_text(st, weft_last_error(nullptr)));
            std::vector<uint8_t> bytes(id.internal, id.internal + sizeof(id.internal));
            store->set(kIdKey, bytes);
        } else {
            std::vector<uint8_t> bytes = store->get(kIdKey); /* waits for rank 0 */
            if (bytes.size() != sizeof(id.internal))
                fail(rank, "the store holds a weft id of " + std::to_string(bytes.size()) +
                               " bytes, not " + std::to_string(sizeof(id.internal)));
            std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
        }
        weft_status_t st = weft_comm_init(&comm_, size, id, rank);
        if (st != WEFT_OK)
            fail(rank, "weft_comm_init failed: " + status_text(st, weft_last_error(nullptr)));
        thread_ = std::thread([this] { completion_loop(); });
    }

    ~ProcessGroupWeft() override
    {
        /* The completion thread may be dropping the last reference to a
         * tensor that has a Python object, which takes the GIL: a caller
         * holding it (Python's garbage collector) must let go to join. */
        std::unique_ptr<py::gil_scoped_release> nogil;
        if (Py_IsInitialized() && PyGILState_Check())
            nogil = std::make_unique<py::gil_scoped_release>();
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
        /* A failed communicator may hold links to dead peers: abort does
         * not wait on them. */
        if (weft_comm_get_error(comm_) != WEFT_OK)
            weft_comm_abort(comm_);
        else
            weft_comm_destroy(comm_);
    }

    const std::string getBackendName() const override { return "weft"; }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        at::Tensor &t = single(tensors, "allreduce");
        weft_op_t op = weft_op_of(rank_, opts.reduceOp, t.scalar_type());
        auto w = make_work(OpType::ALLREDUCE, {t});
        void *p = inout(*w, t);
        auto dc = reduced_as(rank_, t);
        return issue(w, "weft_iallreduce", [&](weft_request_t *req) {
            return weft_iallreduce(p, p, dc.second, dc.first, op, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        at::Tensor &t = single(tensors, "broadcast");
        int root = checked_rank(opts.rootRank, "broadcast root");
        auto w = make_work(OpType::BROADCAST, {t});
        void *p = inout(*w, t);
        auto dc = moved_as(t);
        return issue(w, "weft_ibroadcast", [&](weft_request_t *req) {
            return weft_ibroadcast(p, p, dc.second, dc.first, root, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override
    {
        at::Tensor &t = single(tensors, "reduce");
        int root = checked_rank(opts.rootRank, "reduce root");
        weft_op_t op = weft_op_of(rank_, opts.reduceOp, t.scalar_type());
        auto w = make_work(OpType::REDUCE, {t});
        void *p = inout(*w, t);
        auto dc = reduced_as(rank_, t);
        return issue(w, "weft_ireduce", [&](weft_request_t *req) {
            return weft_ireduce(p, p, dc.second, dc.first, op, root, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &out, at::Tensor &in,
                                                   const c10d::AllgatherOptions &) override
    {
        check_cpu(in, "_allgather_base");
        check_cpu(out, "_allgather_base");
        same_dtype(in, out, "_allgather_base");
        if (out.numel() != in.numel() * size_)
            fail(rank_, "_allgather_base: output has " + std::to_string(out.numel()) +
                            " elements, not input's " + std::to_string(in.numel()) + " x " +
                            std::to_string(size_) + " ranks");
        auto w = make_work(OpType::_ALLGATHER_BASE, {out});
        /* Staging the input first keeps NCCL's in-place form (input a
         * view of out at this rank's slot) apart from a partial overlap. */
        const void *s = input(*w, in);
        void *r = inout(*w, out);
        auto dc = moved_as(in);
        return issue(w, "weft_iallgather", [&](weft_request_t *req) {
            return weft_iallgather(s, r, dc.second, dc.first, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outs,
                                             std::vector<at::Tensor> &ins,
                                             const c10d::AllgatherOptions &) override
    {
        at::Tensor &in = single(ins, "allgather");
        if (outs.size() != 1 || (int)outs[0].size() != size_)
            fail(rank_, "allgather: expects one list of " + std::to_string(size_) + " output tensors");
        for (auto &o : outs[0]) {
            check_cpu(o, "allgather");
            same_dtype(in, o, "allgather");
            if (o.numel() != in.numel())
                fail(rank_, "allgather: an output tensor's size differs from the input's");
        }
        auto w = make_work(OpType::ALLGATHER, outs[0]);
        at::Tensor flat = at::empty({size_ * in.numel()}, in.options().memory_format(c10::nullopt));
        const void *s = input(*w, in);
        w->keep_.push_back(flat);
        for (int i = 0; i < size_; i++)
            w->copy_back_.emplace_back(outs[0][i], flat.narrow(0, i * in.numel(), in.numel())
                                                       .view(outs[0][i].sizes()));
        void *r = flat.data_ptr();
        auto dc = moved_as(in);
        return issue(w, "weft_iallgather", [&](weft_request_t *req) {
            return weft_iallgather(s, r, dc.second, dc.first, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &out, at::Tensor &in,
                                                        const c10d::ReduceScatterOptions &opts) override
    {
        check_cpu(in, "_reduce_scatter_base");
        check_cpu(out, "_reduce_scatter_base");
        same_dtype(in, out, "_reduce_scatter_base");
        if (in.numel() != out.numel() * size_)
            fail(rank_, "_reduce_scatter_base: input has " + std::to_string(in.numel()) +
                            " elements, not output's " + std::to_string(out.numel()) + " x " +
                            std::to_string(size_) + " ranks");
        weft_op_t op = weft_op_of(rank_, opts.reduceOp, in.scalar_type());
        auto w = make_work(OpType::_REDUCE_SCATTER_BASE, {out});
        const void *s = input(*w, in);
        void *r = inout(*w, out);
        auto dc = reduced_as(rank_, out);
        return issue(w, "weft_ireduce_scatter", [&](weft_request_t *req) {
            return weft_ireduce_scatter(s, r, dc.second, dc.first, op, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outs,
                                                  std::vector<std::vector<at::Tensor>> &ins,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        at::Tensor &out = single(outs, "reduce_scatter");
        if (ins.size() != 1 || (int)ins[0].size() != size_)
            fail(rank_, "reduce_scatter: expects one list of " + std::to_string(size_) + " input tensors");
        std::vector<at::Tensor> flat_parts;
        for (auto &i : ins[0]) {
            check_cpu(i, "reduce_scatter");
            same_dtype(i, out, "reduce_scatter");
            if (i.numel() != out.numel())
                fail(rank_, "reduce_scatter: an input tensor's size differs from the output's");
            flat_parts.push_back(i.reshape({-1}));
        }
        weft_op_t op = weft_op_of(rank_, opts.reduceOp, out.scalar_type());
        auto w = make_work(OpType::REDUCE_SCATTER, {out});
        at::Tensor flat = at::cat(flat_parts);
        w->keep_.push_back(flat);
        const void *s = flat.data_ptr();
        void *r = inout(*w, out);
        auto dc = reduced_as(rank_, out);
        return issue(w, "weft_ireduce_scatter", [&](weft_request_t *req) {
            return weft_ireduce_scatter(s, r, dc.second, dc.first, op, comm_, req);
        });
    }

    /* gather and scatter ride on allgather and broadcast: correct, but they
     * move size_ times the bytes a rooted algorithm would. */
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outs,
                                          std::vector<at::Tensor> &ins,
                                          const c10d::GatherOptions &opts) override
    {
        at::Tensor &in = single(ins, "gather");
        int root = checked_rank(opts.rootRank, "gather root");
        bool is_root = root == rank_;
        if (is_root && (outs.size() != 1 || (int)outs[0].size() != size_))
            fail(rank_, "gather: the root expects one list of " + std::to_string(size_) + " output tensors");
        if (!is_root && !outs.empty() && !outs[0].empty())
            fail(rank_, "gather: only the root passes output tensors");
        std::vector<at::Tensor> outputs = is_root ? outs[0] : std::vector<at::Tensor>{};
        for (auto &o : outputs) {
            check_cpu(o, "gather");
            same_dtype(in, o, "gather");
            if (o.numel() != in.numel())
                fail(rank_, "gather: an output tensor's size differs from the input's");
        }
        auto w = make_work(OpType::GATHER, outputs);
        at::Tensor flat = at::empty({size_ * in.numel()}, in.options().memory_format(c10::nullopt));
        const void *s = input(*w, in);
        w->keep_.push_back(flat);
        for (int i = 0; i < (int)outputs.size(); i++)
            w->copy_back_.emplace_back(outputs[i], flat.narrow(0, i * in.numel(), in.numel())
                                                       .view(outputs[i].sizes()));
        void *r = flat.data_ptr();
        auto dc = moved_as(in);
        return issue(w, "weft_iallgather", [&](weft_request_t *req) {
            return weft_iallgather(s, r, dc.second, dc.first, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outs,
                                           std::vector<std::vector<at::Tensor>> &ins,
                                           const c10d::ScatterOptions &opts) override
    {
        at::Tensor &out = single(outs, "scatter");
        int root = checked_rank(opts.rootRank, "scatter root");
        bool is_root = root == rank_;
        if (is_root && (ins.size() != 1 || (int)ins[0].size() != size_))
            fail(rank_, "scatter: the root expects one list of " + std::to_string(size_) + " input tensors");
        if (!is_root && !ins.empty() && !ins[0].empty())
            fail(rank_, "scatter: only the root passes input tensors");
        auto w = make_work(OpType::SCATTER, {out});
        at::Tensor flat;
        if (is_root) {
            std::vector<at::Tensor> parts;
            for (auto &i : ins[0]) {
                check_cpu(i, "scatter");
                same_dtype(i, out, "scatter");
                if (i.numel() != out.numel())
                    fail(rank_, "scatter: an input tensor's size differs from the output's");
                parts.push_back(i.reshape({-1}));
            }
            flat = at::cat(parts);
        } else {
            flat = at::empty({size_ * out.numel()}, out.options().memory_format(c10::nullopt));
        }
        w->keep_.push_back(flat);
        w->copy_back_.emplace_back(out, flat.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
        void *p = flat.data_ptr();
        auto dc = moved_as(flat);
        return issue(w, "weft_ibroadcast", [&](weft_request_t *req) {
            return weft_ibroadcast(p, p, dc.second, dc.first, root, comm_, req);
        });
    }

    /* weft has no tags: the k-th send from A to B meets the k-th recv on B
     * from A, so `tag` must follow that order (it is not checked). */
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst, int) override
    {
        at::Tensor &t = single(tensors, "send");
        int peer = checked_rank(dst, "send destination");
        auto w = make_work(OpType::SEND, {t});
        const void *p = input(*w, t);
        auto dc = moved_as(t);
        return issue(w, "weft_isend", [&](weft_request_t *req) {
            return weft_isend(p, dc.second, dc.first, peer, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src, int) override
    {
        at::Tensor &t = single(tensors, "recv");
        int peer = checked_rank(src, "recv source");
        auto w = make_work(OpType::RECV, {t});
        void *p = inout(*w, t);
        auto dc = moved_as(t);
        return issue(w, "weft_irecv", [&](weft_request_t *req) {
            return weft_irecv(p, dc.second, dc.first, peer, comm_, req);
        });
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                       const c10d::AllreduceCoalescedOptions &opts) override
    {
        if (tensors.empty())
            fail(rank_, "allreduce_coalesced: no tensors");
        std::vector<at::Tensor> parts;
        for (auto &t : tensors) {
            check_cpu(t, "allreduce_coalesced");
            same_dtype(t, tensors[0], "allreduce_coalesced");
            parts.push_back(t.reshape({-1}));
        }
        weft_op_t op = weft_op_of(rank_, opts.reduceOp, tensors[0].scalar_type());
        auto w = make_work(OpType::ALLREDUCE_COALESCED, tensors);
        at::Tensor flat = at::cat(parts); /* one call instead of one per tensor */
        w->keep_.push_back(flat);
        int64_t off = 0;
        for (auto &t : tensors) {
            w->copy_back_.emplace_back(t, flat.narrow(0, off, t.numel()).view(t.sizes()));
            off += t.numel();
        }
        void *p = flat.data_ptr();
        auto dc = reduced_as(rank_, flat);
        return issue(w, "weft_iallreduce (coalesced)", [&](weft_request_t *req) {
            return weft_iallreduce(p, p, dc.second, dc.first, op, comm_, req);
        });
    }

    /* Rows of dim 0 go to rank i as split i (equal splits when none are
     * given), as torch's all_to_all_single defines them. */
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &out, at::Tensor &in,
                                                 std::vector<int64_t> &outSplits,
                                                 std::vector<int64_t> &inSplits,
                                                 const c10d::AllToAllOptions &) override
    {
        check_cpu(in, "alltoall_base");
        check_cpu(out, "alltoall_base");
        same_dtype(in, out, "alltoall_base");
        auto w = make_work(OpType::ALLTOALL_BASE, {out});
        const char *s = static_cast<const char *>(input(*w, in));
        char *r = static_cast<char *>(inout(*w, out));
        Slices send = slices(in, inSplits, "input"), recv = slices(out, outSplits, "output");
        std::vector<const void *> sp;
        std::vector<void *> rp;
        for (int i = 0; i < size_; i++) {
            sp.push_back(s + send.offset[i]);
            rp.push_back(r + recv.offset[i]);
        }
        return exchange(w, sp, send.bytes, rp, recv.bytes);
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outs, std::vector<at::Tensor> &ins,
                                            const c10d::AllToAllOptions &) override
    {
        if ((int)outs.size() != size_ || (int)ins.size() != size_)
            fail(rank_, "alltoall: expects " + std::to_string(size_) + " input and output tensors");
        auto w = make_work(OpType::ALLTOALL, outs);
        std::vector<const void *> sp;
        std::vector<void *> rp;
        std::vector<size_t> sb, rb;
        for (int i = 0; i < size_; i++) {
            check_cpu(ins[i], "alltoall");
            check_cpu(outs[i], "alltoall");
            same_dtype(ins[i], outs[0], "alltoall");
            same_dtype(outs[i], outs[0], "alltoall");
            sp.push_back(input(*w, ins[i]));
            sb.push_back(ins[i].nbytes());
            rp.push_back(inout(*w, outs[i]));
            rb.push_back(outs[i].nbytes());
        }
        return exchange(w, sp, sb, rp, rb);
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override
    {
        auto w = make_work(OpType::BARRIER, {});
        at::Tensor flag = at::zeros({1}, at::kByte);
        w->keep_.push_back(flag);
        void *p = flag.data_ptr();
        return issue(w, "weft_iallreduce (barrier)", [&](weft_request_t *req) {
            return weft_iallreduce(p, p, 1, WEFT_UINT8, WEFT_MAX, comm_, req);
        });
    }

private:
    /* One Work's requests, all issued back to back; it completes when
     * the last is done (weft retires them in issue order). */
    struct Pending {
        std::vector<weft_request_t> reqs;
        const char *fn;
        c10::intrusive_ptr<WeftWork> work;
    };

    c10::intrusive_ptr<WeftWork> make_work(OpType type, std::vector<at::Tensor> outputs)
    {
        return c10::make_intrusive<WeftWork>(rank_, type, std::move(outputs));
    }

    void check_cpu(const at::Tensor &t, const char *fn)
    {
        if (!t.defined())
            fail(rank_, std::string(fn) + ": undefined tensor");
        if (!t.device().is_cpu())
            fail(rank_, std::string(fn) + ": tensor on " + t.device().str() +
                            "; the weft backend takes CPU tensors");
        if (t.layout() != at::kStrided)
            fail(rank_, std::string(fn) + ": only dense (strided) tensors are supported");
    }

    at::Tensor &single(std::vector<at::Tensor> &v, const char *fn)
    {
        if (v.size() != 1)
            fail(rank_, std::string(fn) + ": expects exactly one tensor, got " + std::to_string(v.size()));
        check_cpu(v[0], fn);
        return v[0];
    }

    void same_dtype(const at::Tensor &a, const at::Tensor &b, const char *fn)
    {
        if (a.scalar_type() != b.scalar_type())
            fail(rank_, std::string(fn) + ": dtypes differ (" + c10::toString(a.scalar_type()) + " and " +
                            c10::toString(b.scalar_type()) + ")");
    }

    int checked_rank(int64_t r, const char *what)
    {
        if (r < 0 || r >= size_)
            fail(rank_, std::string(what) + " " + std::to_string(r) + " out of range (0.." +
                            std::to_string(size_ - 1) + ")");
        return (int)r;
    }

    /* A buffer weft only reads: the tensor itself or a contiguous copy. */
    const void *input(WeftWork &w, const at::Tensor &t)
    {
        at::Tensor c = t.contiguous();
        w.keep_.push_back(c);
        return c.data_ptr();
    }

    /* A buffer weft writes: the tensor, or a contiguous copy that is
     * copied back into it once the operation succeeded. */
    void *inout(WeftWork &w, const at::Tensor &t)
    {
        at::Tensor c = t.contiguous();
        w.keep_.push_back(c);
        if (!c.is_same(t))
            w.copy_back_.emplace_back(t, c);
        return c.data_ptr();
    }

    /* Byte offset and length of each rank's split of t's dim 0. */
    struct Slices {
        std::vector<size_t> offset, bytes;
    };

    Slices slices(const at::Tensor &t, const std::vector<int64_t> &splits, const char *what)
    {
        int64_t rows = t.dim() == 0 ? 1 : t.size(0);
        size_t row_bytes = rows == 0 ? 0 : t.nbytes() / rows;
        std::vector<int64_t> sp = splits;
        if (sp.empty()) {
            if (rows % size_ != 0)
                fail(rank_, std::string("alltoall_base: ") + what + "'s " + std::to_string(rows) +
                                " rows do not split evenly over " + std::to_string(size_) + " ranks");
            sp.assign(size_, rows / size_);
        }
        if ((int)sp.size() != size_)
            fail(rank_, std::string("alltoall_base: ") + std::to_string(sp.size()) + " " + what +
                            " splits for " + std::to_string(size_) + " ranks");
        Slices sl;
        int64_t at_row = 0;
        for (int64_t n : sp) {
            if (n < 0)
                fail(rank_, std::string("alltoall_base: a negative ") + what + " split");
            sl.offset.push_back(at_row * row_bytes);
            sl.bytes.push_back(n * row_bytes);
            at_row += n;
        }
        if (at_row != rows)
            fail(rank_, std::string("alltoall_base: ") + what + " splits add up to " +
                            std::to_string(at_row) + " rows, not " + std::to_string(rows));
        return sl;
    }

    /* Every rank's part to every rank, as bytes.  Round k receives from
     * rank - k and sends to rank + k, so on every rank the matching sends
     * and receives come at the same point of the issue order (weft keeps
     * a bounded number of operations in flight).  Its own part is copied
     * here.  A pair with nothing to move is skipped on both sides, since
     * both see the same split. */
    c10::intrusive_ptr<c10d::Work> exchange(const c10::intrusive_ptr<WeftWork> &w,
                                            const std::vector<const void *> &sp,
                                            const std::vector<size_t> &sb,
                                            const std::vector<void *> &rp,
                                            const std::vector<size_t> &rb)
    {
        if (sb[rank_] != rb[rank_])
            fail(rank_, "alltoall: this rank sends itself " + std::to_string(sb[rank_]) +
                            " bytes but expects " + std::to_string(rb[rank_]));
        if (sb[rank_] > 0)
            std::memcpy(rp[rank_], sp[rank_], sb[rank_]);
        return issue_many(w, "weft_isend/weft_irecv (alltoall)", [&](std::vector<weft_request_t> &reqs) {
            for (int k = 1; k < size_; k++) {
                int from = (rank_ - k + size_) % size_, to = (rank_ + k) % size_;
                weft_request_t req;
                if (rb[from] > 0) {
                    weft_status_t st = weft_irecv(rp[from], rb[from], WEFT_UINT8, from, comm_, &req);
                    if (st != WEFT_OK)
                        return st;
                    reqs.push_back(req);
                }
                if (sb[to] > 0) {
                    weft_status_t st = weft_isend(sp[to], sb[to], WEFT_UINT8, to, comm_, &req);
                    if (st != WEFT_OK)
                        return st;
                    reqs.push_back(req);
                }
            }
            return WEFT_OK;
        });
    }

    c10::intrusive_ptr<c10d::Work> issue(const c10::intrusive_ptr<WeftWork> &w, const char *fn,
                                         const std::function<weft_status_t(weft_request_t *)> &start)
    {
        return issue_many(w, fn, [&](std::vector<weft_request_t> &reqs) {
            weft_request_t req = nullptr;
            weft_status_t st = start(&req);
            if (st == WEFT_OK)
                reqs.push_back(req);
            return st;
        });
    }

    /* start issues requests into its vector.  If it fails part way, the
     * requests it did issue are still waited for (weft cannot take them
     * back) by a Work nobody holds, and the call throws. */
    c10::intrusive_ptr<c10d::Work> issue_many(
        const c10::intrusive_ptr<WeftWork> &w, const char *fn,
        const std::function<weft_status_t(std::vector<weft_request_t> &)> &start)
    {
        std::string err;
        {
            std::lock_guard<std::mutex> lock(mu_);
            std::vector<weft_request_t> reqs;
            weft_status_t st = start(reqs);
            if (st != WEFT_OK)
                err = std::string(fn) + " failed: " + status_text(st, weft_last_error(comm_));
            if (st == WEFT_OK || !reqs.empty()) /* none issued: done at once */
                queue_.push_back(Pending{std::move(reqs), fn,
                                         st == WEFT_OK ? w : make_work(OpType::UNKNOWN, {})});
        }
        cv_.notify_one();
        if (!err.empty())
            fail(rank_, err);
        return w;
    }

    void completion_loop()
    {
        for (;;) {
            Pending p;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
                if (queue_.empty())
                    return; /* stop_ and drained */
                p = queue_.front();
                queue_.pop_front();
            }
            weft_status_t st = WEFT_OK;
            for (weft_request_t req : p.reqs) {
                weft_status_t one = weft_wait(req); /* each must be released */
                if (st == WEFT_OK)
                    st = one;
            }
            std::exception_ptr e;
            if (st != WEFT_OK) {
                try {
                    fail(rank_, std::string(p.fn) + " failed: " + status_text(st, weft_last_error(comm_)));
                } catch (...) {
                    e = std::current_exception();
                }
            }
            p.work->complete(e);
        }
    }

    weft_comm_t comm_ = nullptr;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    bool stop_ = false;
    std::thread thread_;
};

c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                              int size)
{
    return c10::make_intrusive<ProcessGroupWeft>(store, rank, size);
}

} // namespace

PYBIND11_MODULE(_C, m)
{
    m.doc() = "weft's c10d ProcessGroup (use torch_weft, which registers it)";
    m.def("create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
          py::call_guard<py::gil_scoped_release>(),
          "A weft ProcessGroup over size ranks, rendezvousing through store.");
    m.def("version", [] {
        return std::to_string(WEFT_VERSION_MAJOR) + "." + std::to_string(WEFT_VERSION_MINOR) + "." +
               std::to_string(WEFT_VERSION_PATCH);
    });
}
