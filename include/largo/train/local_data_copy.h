// DataSourceOptions::local_copy_dir (VISSL's COPY_TO_LOCAL_DISK) for a run of several ranks:
// the first rank of each machine copies a split's files into the directory
// (data::copy_to_local_disk), and every rank then reads the copies. VISSL copies in its
// launcher, once per node, before the workers start; here the ranks may have been started
// by anything (torchrun, SLURM), so they agree among themselves instead.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

// `options` with each split that has a local_copy_dir reading from its copy there (its path
// and label_path replaced). Rank r copies when r % procs_per_node == 0; collective over
// `group` (every rank waits until its machine's copies are whole). Throws DataError on every
// rank when a copy failed on any (the rank that failed says why; the others name it).
TrainerOptions with_local_data_copies(
    const TrainerOptions& options, comm::ProcessGroup& group, int procs_per_node);

} // namespace largo::train
