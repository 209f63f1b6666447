#include "h5ddp/sharded_optimizer.hpp"

#include "h5ddp/error.hpp"

namespace h5ddp {

ShardedOptimizer::ShardedOptimizer(ShardedDataParallel& dp, const Factory& make) : dp_(dp) {
  local_ = make(dp.owned_parameters());
  if (local_ == nullptr) throw ConfigError("ShardedOptimizer: the optimizer factory returned null");
}

void ShardedOptimizer::step() {
  local_->step();
  dp_.gather_parameters();
}

std::vector<ParamPiece> ShardedOptimizer::pieces() const {
  std::vector<ParamPiece> out;
  for (const OwnedPiece& p : dp_.owned_pieces())
    out.push_back(ParamPiece{dp_.parameter_names()[p.index], p.row_begin, p.row_end, p.tensor});
  return out;
}

void ShardedOptimizer::set_lr(double lr) {
  for (auto& group : local_->param_groups()) group.options().set_lr(lr);
}

}  // namespace h5ddp
