// Test-only fault injection (private to h5ddp_checkpoint): the kills and bit flips tests/faults arms through the
// environment (docs/ARCHITECTURE.md, "Environment variables").
#pragma once

namespace h5ddp::ckpt {

// Test-only hook (issues 9, 23): H5DDP_FAULT_INJECT=<phase>:<rank|all>, armed by H5DDP_TEST_HOOKS=1, raises
// SIGKILL on the named rank(s) when the save reaches `phase`: before_data, mid_data, before_rename,
// before_latest; on rank 0 only: latest_written (latest.tmp written and fsynced, not renamed), latest_renamed
// (renamed, directory not fsynced), mid_retention (after each checkpoint retention removed). In a load (issue 59):
// load_after_manifest (rank 0 has read the metadata, before its broadcast), load_mid_data (between the page-cache
// reads and the direct reads, or before the exchange).
void maybe_inject_fault(const char* phase, int rank);
// Whether H5DDP_FAULT_INJECT (armed as above) names `phase` and this rank. Besides the kills above:
// load_flip, one bit of the first tensor flipped in this rank's copy as a load reads (page cache) or
// receives (share + exchange) it, before it is verified: one node's copy gone wrong.
bool fault_armed(const char* phase, int rank);

}  // namespace h5ddp::ckpt
