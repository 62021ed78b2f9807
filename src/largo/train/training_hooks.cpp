#include <largo/train/training_hooks.h>

#include <largo/models/flop_count.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace largo::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_duration(double seconds) {
  auto total = static_cast<int64_t>(std::max(0.0, seconds));
  if (total >= 3600) {
    return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
  }
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

} // namespace

TrainingHook::~TrainingHook() = default;

// ---- logging -------------------------------------------------------------------------

LoggingHook::LoggingHook(
    parallel::ParallelModel& model,
    const data::DataLoader& loader,
    RunRecords& records,
    int64_t log_frequency,
    int64_t training_flops_per_sample,
    double peak_flops_per_sec)
    : model_(model),
      loader_(loader),
      records_(records),
      log_frequency_(log_frequency),
      training_flops_per_sample_(training_flops_per_sample),
      peak_flops_per_sec_(peak_flops_per_sec) {}

bool LoggingHook::reads_results_after(const checkpoint::TrainingProgress& progress) const {
  return progress.iteration % log_frequency_ == 0 ||
         progress.iteration_in_epoch == progress.iterations_per_epoch;
}

void LoggingHook::on_step_end(const StepEvent& event) {
  const checkpoint::TrainingProgress& progress = event.progress;
  window_images_ += event.step.num_images;
  for (const StepResult& step : event.steps_read) { // every step of the window, once read
    window_loss_ += step.loss;
    ++window_steps_;
    last_loss_read_ = step.loss;
  }
  if (event.step_peak_bytes) {
    window_peak_bytes_ = std::max(window_peak_bytes_, *event.step_peak_bytes);
  }
  if (reads_results_after(progress)) {
    log_window(event);
  }
  if (model_.process_group().rank() == 0) {
    records_.progress_bar.update(
        progress.iteration_in_epoch,
        progress.iterations_per_epoch,
        fmt::format(
            "epoch {}/{} loss {:.4f}", progress.epoch + 1, progress.num_epochs, last_loss_read_));
  }
}

// The mean loss and the images of all ranks (a collective, at the same iterations on every
// rank; over the data-parallel group, which a pipeline's stages share), printed and recorded
// by rank 0.
void LoggingHook::log_window(const StepEvent& event) {
  const checkpoint::TrainingProgress& progress = event.progress;
  comm::ProcessGroup& group = model_.data_parallel_group();
  at::Tensor totals = at::tensor({window_loss_, static_cast<double>(window_images_)}, at::kDouble);
  group.all_reduce(totals);
  const double seconds = seconds_since(window_start_);
  const double images_per_sec = seconds > 0 ? totals[1].item<double>() / seconds : 0.0;
  const int64_t steps = std::max<int64_t>(window_steps_, 1);
  const int64_t remaining =
      progress.num_epochs * progress.iterations_per_epoch - progress.iteration;
  const double mean_loss = totals[0].item<double>() / steps / group.world_size();
  records_.progress_bar.clear();
  nlohmann::json record = {
      {"phase", "train"},
      {"epoch", progress.epoch},
      {"iteration", progress.iteration},
      {"loss", mean_loss},
      {"lr", event.lr},
      {"images_per_sec", images_per_sec},
      {"wall_time", wall_time()}};
  if (event.weight_decay) {
    record["weight_decay"] = *event.weight_decay;
  }
  std::string flops;
  if (training_flops_per_sample_ > 0) {
    const double flops_per_sec = images_per_sec * static_cast<double>(training_flops_per_sample_);
    record["flops_per_sec"] = flops_per_sec;
    flops = fmt::format(" {}/s", models::format_flops(flops_per_sec));
    if (peak_flops_per_sec_ > 0) {
      const double mfu = flops_per_sec / peak_flops_per_sec_;
      record["mfu"] = mfu;
      flops += fmt::format(" MFU {:.1f}%", 100.0 * mfu);
    }
  }
  std::string scaling;
  const precision::MixedPrecision& precision = model_.precision();
  if (precision.has_loss_scaling()) {
    record["loss_scale"] = precision.loss_scale();
    record["skipped_steps"] = precision.skipped_steps(); // since the run started
    scaling = fmt::format(
        " loss scale {:g} skipped steps {}", precision.loss_scale(), precision.skipped_steps());
  }
  if (event.step_peak_bytes) {
    record["step_peak_bytes"] = window_peak_bytes_; // this rank's (rank 0's)
  }
  const data::LoaderStats now = loader_.stats();
  const data::LoaderStats loader = now - last_loader_stats_;
  last_loader_stats_ = now;
  record["loader_images_per_sec"] = loader.images_per_second();
  record["loader_wait_fraction"] = loader.wait_fraction();
  std::string bad;
  if (now.num_bad_samples > 0) {
    record["bad_samples"] = now.num_bad_samples; // this epoch's, on this rank
    bad = fmt::format(", {} bad samples skipped", now.num_bad_samples);
  }
  spdlog::info(
      "train epoch {}/{} iter {}/{} loss {:.4f} lr {:.5g}{} {:.0f} img/s{} eta {} "
      "(data: {:.0f} img/s, waited {:.0f}%{})",
      progress.epoch + 1,
      progress.num_epochs,
      progress.iteration_in_epoch,
      progress.iterations_per_epoch,
      mean_loss,
      event.lr,
      scaling,
      images_per_sec,
      flops,
      format_duration(remaining * seconds / steps),
      loader.images_per_second(),
      100.0 * loader.wait_fraction(),
      bad);
  write_records(record, progress.iteration);
  window_start_ = std::chrono::steady_clock::now();
  window_images_ = 0;
  window_loss_ = 0.0;
  window_steps_ = 0;
  window_peak_bytes_ = 0;
}

// metrics.jsonl gets the whole record; TensorBoard the scalars worth plotting.
void LoggingHook::write_records(const nlohmann::json& record, int64_t iteration) {
  if (records_.metrics) {
    records_.metrics->write(record);
  }
  if (!records_.tensorboard) {
    return;
  }
  for (const auto& [key, tag] : std::initializer_list<std::pair<const char*, const char*>>{
           {"loss_scale", "train/loss_scale"},
           {"loss", "train/loss"},
           {"lr", "train/lr"},
           {"images_per_sec", "train/images_per_sec"},
           {"flops_per_sec", "train/flops_per_sec"},
           {"mfu", "train/mfu"}}) {
    if (record.contains(key)) {
      records_.tensorboard->add_scalar(tag, record.at(key).get<double>(), iteration);
    }
  }
}

void LoggingHook::on_epoch_end(checkpoint::TrainingProgress&) {
  records_.progress_bar.clear();
  last_loader_stats_ = {}; // the loader counts afresh from the next start_epoch
}

// ---- evaluation ----------------------------------------------------------------------

EvaluationHook::EvaluationHook(
    parallel::ParallelModel& model,
    TrainingData& data,
    torch::Device device,
    EvaluationOptions options,
    int64_t every_num_epochs,
    RunRecords& records,
    NewBestCallback on_new_best)
    : model_(model),
      data_(data),
      device_(device),
      options_(std::move(options)),
      every_num_epochs_(every_num_epochs),
      records_(records),
      on_new_best_(std::move(on_new_best)) {}

void EvaluationHook::on_epoch_end(checkpoint::TrainingProgress& progress) {
  if (progress.epoch % every_num_epochs_ != 0 && progress.epoch != progress.num_epochs) {
    return;
  }
  report(progress);
}

void EvaluationHook::also_evaluate(const optim::ModelEma& ema, optim::NamedTensors model_tensors) {
  ema_ = &ema;
  ema_tensors_ = std::move(model_tensors);
}

void EvaluationHook::report(checkpoint::TrainingProgress& progress) {
  const EvaluationResult result = evaluate(model_, data_, device_, options_);
  progress.top1 = result.top(1);
  progress.top5 = result.top(5);
  const bool new_best =
      progress.top1 && (!progress.best_top1 || *progress.top1 > *progress.best_top1);
  if (new_best) {
    progress.best_top1 = progress.top1;
  }
  record(result, progress, "test");
  if (ema_) {
    record(evaluate_average(), progress, "test_ema");
  }
  if (new_best && on_new_best_) {
    on_new_best_(progress);
  }
}

EvaluationResult EvaluationHook::evaluate_average() {
  torch::NoGradGuard no_grad;
  const optim::AverageInModel average(*ema_, ema_tensors_);
  return evaluate(model_, data_, device_, options_);
}

namespace {

// Several outputs (a linear evaluation's heads): which one the figures are of, and every
// output's, e.g. "top1_per_output": [61.2, 70.4] and "(best output 1 of 2; top1 61.20% 70.40%)".
void record_outputs(const EvaluationResult& result, nlohmann::json& record, std::string& line) {
  if (result.output_topk_percent.empty()) {
    return;
  }
  record["best_output"] = result.best_output;
  line +=
      fmt::format(" (best output {} of {};", result.best_output, result.output_topk_percent.size());
  for (size_t k = 0; k < result.topk.size(); ++k) {
    std::vector<double> values;
    for (const auto& output : result.output_topk_percent) {
      values.push_back(output[k]);
    }
    record[fmt::format("top{}_per_output", result.topk[k])] = values;
    line += fmt::format(" top{} {:.2f}%", result.topk[k], fmt::join(values, "% "));
  }
  line += ")";
}

} // namespace

// The console line, the metrics.jsonl record and the TensorBoard scalars of one evaluation:
// phase "test" (the model) or "test_ema" (its average).
void EvaluationHook::record(
    const EvaluationResult& result,
    const checkpoint::TrainingProgress& progress,
    const std::string& phase) {
  // The epoch just trained, from 0 (0 too for a TEST_ONLY run of weights never trained here).
  const int64_t epoch_index = std::max<int64_t>(progress.epoch - 1, 0);
  nlohmann::json record = {
      {"phase", phase},
      {"epoch", epoch_index},
      {"iteration", progress.iteration},
      {"loss", result.loss},
      {"wall_time", wall_time()}};
  std::string line = fmt::format(
      "{} epoch {}/{} loss {:.4f}",
      phase == "test" ? "test" : "test (EMA)",
      progress.epoch,
      progress.num_epochs,
      result.loss);
  for (size_t i = 0; i < result.topk.size(); ++i) {
    const std::string name = fmt::format("top{}", result.topk[i]);
    record[name] = result.topk_percent[i];
    line += fmt::format(" {} {:.2f}%", name, result.topk_percent[i]);
    if (records_.tensorboard) {
      records_.tensorboard->add_scalar(
          phase + "/" + name, result.topk_percent[i], progress.iteration);
    }
  }
  record_outputs(result, record, line);
  records_.progress_bar.clear();
  spdlog::info("{}", line);
  if (records_.metrics) {
    records_.metrics->write(record);
  }
  if (records_.tensorboard) {
    records_.tensorboard->add_scalar(phase + "/loss", result.loss, progress.iteration);
    records_.tensorboard->flush();
  }
}

// ---- checkpoints ---------------------------------------------------------------------

CheckpointHook::CheckpointHook(
    checkpoint::TrainingState& state,
    std::filesystem::path dir,
    int64_t frequency_epochs,
    int64_t frequency_iterations,
    RunRecords& records)
    : state_(state),
      dir_(std::move(dir)),
      frequency_epochs_(frequency_epochs),
      frequency_iterations_(frequency_iterations),
      records_(records) {}

bool CheckpointHook::reads_results_after(const checkpoint::TrainingProgress& progress) const {
  return frequency_iterations_ > 0 && progress.iteration % frequency_iterations_ == 0 &&
         progress.iteration_in_epoch < progress.iterations_per_epoch;
}

void CheckpointHook::on_step_end(const StepEvent& event) {
  const checkpoint::TrainingProgress& progress = event.progress;
  if (reads_results_after(progress)) { // a mid-epoch checkpoint
    records_.progress_bar.clear();
    state_.save(dir_, fmt::format("model_iteration{}.torch", progress.iteration));
  }
}

void CheckpointHook::on_epoch_end(checkpoint::TrainingProgress& progress) {
  records_.progress_bar.clear();
  if (progress.complete) {
    state_.save(dir_, fmt::format("model_final_checkpoint_phase{}.torch", progress.epoch - 1));
  } else if (progress.epoch % frequency_epochs_ == 0) {
    state_.save(dir_, fmt::format("model_phase{}.torch", progress.epoch - 1));
  }
}

} // namespace largo::train
