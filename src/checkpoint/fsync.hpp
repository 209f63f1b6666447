// Durability of the commit protocol (private to h5ddp_checkpoint): the writer fsyncs the file and the run
// directory, RunDir the directory after moving a pointer.
#pragma once

#include <string>

namespace h5ddp::ckpt {

// fsync of a file, or of a directory (its entries: a rename in it); throws CheckpointError naming the path.
void fsync_path(const std::string& path, bool directory);

}  // namespace h5ddp::ckpt
