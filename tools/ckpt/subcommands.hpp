// The subcommands of h5ddp-ckpt. Each takes its arguments (after the subcommand name) and returns the
// process exit code; each lives in its own file. Add a subcommand by adding a function here and a row
// to the table in h5ddp_ckpt.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ddp/comm.hpp"

namespace h5ddp::ckpt_tool {

using Args = std::vector<std::string>;

int run_info(const Args& args);     // info FILE: 0 ok, 1 not a valid checkpoint
int run_verify(const Args& args);   // verify FILE...: 0 all valid, 1 otherwise
int run_diff(const Args& args);     // diff A B: 0 identical, 1 differ, 2 error
int run_goodput(const Args& args);  // goodput RUN_DIR [--json]: 0 reported, 1 no metrics log or no run in it
// export / import / eval: exec h5ddp-ckpt-torch (LibTorch) from this program's directory (ckpt/torch_tool.cpp).
int run_export(const Args& args);
int run_import(const Args& args);
int run_eval(const Args& args);

// "1.5 MiB"
std::string human_bytes(uint64_t n);
// Element i of raw little-endian bytes of `dtype`, as a double (float16/bfloat16 widened exactly).
double element_as_double(const uint8_t* bytes, DType dtype, size_t i);

}  // namespace h5ddp::ckpt_tool
