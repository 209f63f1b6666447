#include "h5ddp/ddp.hpp"

namespace h5ddp {

DistributedDataParallel::DistributedDataParallel(Comm& comm, torch::nn::Module& module, DdpOptions options)
    : DataParallel(comm, module, options, "DistributedDataParallel") {
  check_same_model("", "shard=none");
  build();
}

void DistributedDataParallel::setup_bucket(size_t b) {
  Bucket& st = *bucket_state_[b];
  const bool last = b + 1 == buckets_.size();  // one more element: the unused-parameter count (flush_unused)
  st.buffer = torch::zeros({st.grad_numel + (last ? 1 : 0)},
                           params_[buckets_[b].params.front()].options().requires_grad(false));
  for (size_t i : buckets_[b].params) param_[i].slot = alias(st.buffer, param_[i].offset, params_[i].sizes());
}

std::unique_ptr<Work> DistributedDataParallel::launch_reduction(size_t b) {
  Bucket& st = *bucket_state_[b];
  torch::Tensor& sent = options_.reduce_bf16 && st.buffer.is_cuda() && st.buffer.scalar_type() == torch::kFloat32
                            ? (st.wire = st.buffer.to(torch::kBFloat16))
                            : st.buffer;
  stats_.bytes_reduced += sent.nbytes();
  return st.comm->allreduce_async(sent.data_ptr(), static_cast<size_t>(sent.numel()), to_dtype(sent.scalar_type()),
                                  ReduceOp::kSum);
}

double DistributedDataParallel::reductions_done(size_t /*unused_here*/) {
  const Bucket& last = *bucket_state_.back();  // the count's sum over ranks travelled in the last bucket
  return last.buffer.narrow(0, last.grad_numel, 1).item<double>();
}

void DistributedDataParallel::finish_gradients(const torch::Tensor& used_map) {
  const double world = comm_.size();
  if (world > 1)
    for (auto& st : bucket_state_) st->buffer.narrow(0, 0, st->grad_numel).div_(world);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    if (used_map.defined() && used_map[static_cast<int64_t>(i)].item<int32_t>() == 0 && !grad.defined()) continue;
    // .grad becomes a view of the bucket: the next backward accumulates straight into it (no copy-in).
    if (!grad.defined() || grad.data_ptr() != param_[i].slot.data_ptr()) grad = param_[i].slot;
  }
}

}  // namespace h5ddp
