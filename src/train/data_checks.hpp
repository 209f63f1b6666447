// h5ddp-train's checks that the data fits the model, before the first step.
#pragma once

#include "h5ddp/comm.hpp"
#include "train/batch.hpp"
#include "train/dataset.hpp"
#include "train/models.hpp"

namespace h5ddp {

// Collective (the same verdict everywhere). The model takes the samples (a forward of two of them in eval mode),
// --keep-best has an accuracy to keep (classification), and every label of `train` and `test` (may be null) lies
// in [0, classes): each rank scans its share of the labels. Throws the lowest failing rank's error on every rank.
void check_data_fits_model(const TrainModel& model, const Dataset& train, const Dataset* test, const Compute& compute,
                           bool keep_best, Comm& comm);

}  // namespace h5ddp
