// The commands h5ddp-train prints at the end of a run: the one that continues it and the one that inspects its
// checkpoint. Pure functions of the command line and a few facts, so they are unit-tested.
#pragma once

#include <string>
#include <vector>

namespace h5ddp {

// Words joined by spaces, each quoted for a POSIX shell where it needs it.
std::string shell_join(const std::vector<std::string>& words);

// `args` less each option in `names` with its value ("--name V" or "--name=V").
std::vector<std::string> without_options(const std::vector<std::string>& args, const std::vector<std::string>& names);

struct ResumeHintFacts {
  std::vector<std::string> argv;  // h5ddp-train's, argv[0] first
  int world_size = 1;
  bool root_user = false;       // mpirun then needs --allow-run-as-root
  bool oversubscribed = false;  // more ranks on this host than cores: --oversubscribe
  std::string launcher_hint;    // H5DDP_RESUME_HINT (a launch script's own line); empty: an mpirun line
};

// The command that continues this run from its newest checkpoint: the launcher's line when there is one, else
// mpirun with what this machine needs and this run's options less --resume/--init-from (which would start over
// or go back to an older step).
std::string resume_command(const ResumeHintFacts& facts);

// Local. The facts of this process: `argv`, `world_size`, whether it runs as root, whether `local_size` ranks
// oversubscribe this host's cores, and H5DDP_RESUME_HINT.
ResumeHintFacts this_process_facts(const std::vector<std::string>& argv, int world_size, int local_size);

}  // namespace h5ddp
