#include <largo/parallel/pipeline/pipeline_split_backward.h>

#include <largo/core/error.h>

#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

namespace largo::parallel {

using torch::autograd::Edge;
using torch::autograd::Node;

namespace {

// The gradients that flowed into an intermediate node during the input pass.
struct CapturedGrads {
  std::vector<at::Tensor> grads;
};

struct CaptureHook : torch::autograd::FunctionPreHook {
  explicit CaptureHook(std::shared_ptr<CapturedGrads> slot) : slot(std::move(slot)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    slot->grads = grads;
    return grads;
  }
  std::shared_ptr<CapturedGrads> slot;
};

// Parameters whose gradients the weight pass computes together, and where it starts.
struct ParameterGroup {
  std::vector<std::shared_ptr<Node>> intermediates;
  std::vector<std::shared_ptr<CapturedGrads>> captured; // one per intermediate
  std::vector<std::shared_ptr<Node>> accumulators;
  std::vector<at::Tensor> parameters; // one per accumulator
  // The nodes between the intermediates and the accumulators (accumulators included): the
  // part of the graph only the weight pass runs.
  std::unordered_set<Node*> parameter_side;
};

// The graph below `root`, as each node's parents (the nodes with an edge to it).
struct Graph {
  std::unordered_map<Node*, std::vector<Node*>> parents;
  std::unordered_map<Node*, std::shared_ptr<Node>> nodes;
};

Graph walk_graph(const std::shared_ptr<Node>& root) {
  Graph graph;
  std::deque<Node*> queue{root.get()};
  graph.nodes[root.get()] = root;
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    for (const Edge& edge : node->next_edges()) {
      if (!edge.function) {
        continue;
      }
      Node* child = edge.function.get();
      graph.parents[child].push_back(node);
      if (graph.nodes.emplace(child, edge.function).second) {
        queue.push_back(child);
      }
    }
  }
  return graph;
}

// `start` and every node above it (towards the root); with `stop`, the walk does not enter
// nodes of `stop` but returns those it reached.
std::unordered_set<Node*> walk_up(
    const Graph& graph,
    Node* start,
    const std::unordered_set<Node*>* stop,
    std::vector<Node*>* reached) {
  std::unordered_set<Node*> seen{start};
  std::deque<Node*> queue{start};
  while (!queue.empty()) {
    Node* node = queue.front();
    queue.pop_front();
    auto it = graph.parents.find(node);
    if (it == graph.parents.end()) {
      continue;
    }
    for (Node* parent : it->second) {
      if (stop && stop->count(parent)) {
        if (std::find(reached->begin(), reached->end(), parent) == reached->end()) {
          reached->push_back(parent);
        }
      } else if (seen.insert(parent).second) {
        queue.push_back(parent);
      }
    }
  }
  return seen;
}

// Groups the parameters by shared intermediates and hooks a capture on each intermediate.
std::vector<ParameterGroup> plan_weight_pass(
    const Graph& graph,
    const std::unordered_set<Node*>& input_closure,
    const std::vector<at::Tensor>& parameters) {
  std::vector<ParameterGroup> groups;
  std::unordered_map<Node*, size_t> group_of; // intermediate -> index into groups
  for (const auto& parameter : parameters) {
    auto accumulator = torch::autograd::impl::try_get_grad_accumulator(parameter);
    if (!accumulator || !graph.parents.count(accumulator.get())) {
      continue; // not used by this micro-batch's graph
    }
    std::vector<Node*> intermediates;
    ParameterGroup merged;
    merged.parameter_side = walk_up(graph, accumulator.get(), &input_closure, &intermediates);
    merged.accumulators.push_back(accumulator);
    merged.parameters.push_back(parameter);
    // Merge every group that shares one of these intermediates into the new one.
    std::unordered_set<size_t> absorbed;
    for (Node* node : intermediates) {
      auto it = group_of.find(node);
      if (it != group_of.end() && absorbed.insert(it->second).second) {
        ParameterGroup& old = groups[it->second];
        for (size_t i = 0; i < old.intermediates.size(); ++i) {
          merged.intermediates.push_back(old.intermediates[i]);
          merged.captured.push_back(old.captured[i]);
        }
        merged.accumulators.insert(
            merged.accumulators.end(), old.accumulators.begin(), old.accumulators.end());
        merged.parameters.insert(
            merged.parameters.end(), old.parameters.begin(), old.parameters.end());
        merged.parameter_side.insert(old.parameter_side.begin(), old.parameter_side.end());
        old = ParameterGroup{};
      } else if (it == group_of.end()) {
        merged.intermediates.push_back(graph.nodes.at(node));
        merged.captured.push_back(std::make_shared<CapturedGrads>());
        node->add_pre_hook(std::make_unique<CaptureHook>(merged.captured.back()));
      }
    }
    groups.push_back(std::move(merged));
    for (const auto& node : groups.back().intermediates) {
      group_of[node.get()] = groups.size() - 1;
    }
  }
  return groups;
}

// Step 1 of a group's weight pass: each intermediate run again on its captured gradients,
// asked only for the gradients along its edges into the parameter side — so the engine
// neither repeats the input pass's work nor walks down the input path to another
// intermediate (which would count that one's gradient twice, e.g. for a weight used by two
// layers). Returns those edges and their gradients.
std::pair<torch::autograd::edge_list, torch::autograd::variable_list>
parameter_side_gradients(const ParameterGroup& group) {
  torch::autograd::edge_list edges;
  torch::autograd::variable_list grads;
  for (size_t i = 0; i < group.intermediates.size(); ++i) {
    const auto& node = group.intermediates[i];
    torch::autograd::edge_list roots, outputs;
    torch::autograd::variable_list root_grads;
    const auto& captured = group.captured[i]->grads;
    for (size_t j = 0; j < captured.size(); ++j) {
      if (captured[j].defined()) {
        roots.emplace_back(node, static_cast<uint32_t>(j));
        root_grads.push_back(captured[j]);
      }
    }
    for (const Edge& edge : node->next_edges()) {
      if (edge.function && group.parameter_side.count(edge.function.get())) {
        outputs.push_back(edge);
      }
    }
    if (roots.empty() || outputs.empty()) {
      continue;
    }
    auto results = torch::autograd::Engine::get_default_engine().execute(
        roots,
        root_grads,
        /*keep_graph=*/true,
        /*create_graph=*/false,
        /*accumulate_grad=*/false,
        outputs);
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (results[k].defined()) {
        edges.push_back(outputs[k]);
        grads.push_back(results[k]);
      }
    }
  }
  return {edges, grads};
}

void accumulate_grad(at::Tensor& parameter, const at::Tensor& grad) {
  if (!grad.defined()) {
    return;
  }
  torch::NoGradGuard no_grad;
  at::Tensor& current = parameter.mutable_grad();
  if (current.defined()) {
    current.add_(grad);
  } else {
    current = grad.detach().clone(); // the engine's result may alias a captured gradient
  }
}

// A group's weight pass: the gradients along the edges into the parameter side (step 1),
// then, from those edges, the parameters' gradients (step 2; an edge straight into a
// parameter's accumulator already carries its gradient).
void weight_pass_of(ParameterGroup& group) {
  auto [edges, grads] = parameter_side_gradients(group);
  torch::autograd::edge_list roots, outputs;
  torch::autograd::variable_list root_grads;
  for (size_t k = 0; k < edges.size(); ++k) {
    auto it = std::find(group.accumulators.begin(), group.accumulators.end(), edges[k].function);
    if (it != group.accumulators.end()) {
      accumulate_grad(
          group.parameters[static_cast<size_t>(it - group.accumulators.begin())], grads[k]);
    } else {
      roots.push_back(edges[k]);
      root_grads.push_back(grads[k]);
    }
  }
  if (roots.empty()) {
    return;
  }
  for (const auto& accumulator : group.accumulators) {
    outputs.emplace_back(accumulator, 0);
  }
  auto results = torch::autograd::Engine::get_default_engine().execute(
      roots,
      root_grads,
      /*keep_graph=*/true,
      /*create_graph=*/false,
      /*accumulate_grad=*/false,
      outputs);
  for (size_t k = 0; k < group.parameters.size(); ++k) {
    accumulate_grad(group.parameters[k], results[k]);
  }
}

} // namespace

struct SplitBackward::State {
  at::Tensor output;
  at::Tensor grad_output;
  bool full_backward = false; // the input needs no gradient: the weight pass does it all
  std::vector<ParameterGroup> groups;
  bool done = false;
};

SplitBackward::SplitBackward(std::unique_ptr<State> state) : state_(std::move(state)) {}
SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;
SplitBackward::~SplitBackward() = default;

SplitBackward SplitBackward::input_pass(
    const at::Tensor& output,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const std::vector<at::Tensor>& parameters,
    at::Tensor& input_grad) {
  auto state = std::make_unique<State>();
  state->output = output;
  state->grad_output = grad_output;
  input_grad = at::Tensor();
  const auto input_node =
      input.requires_grad() ? torch::autograd::impl::gradient_edge(input).function : nullptr;
  if (!output.grad_fn() || !input_node) {
    state->full_backward = true;
    return SplitBackward(std::move(state));
  }
  const Graph graph = walk_graph(output.grad_fn());
  if (!graph.parents.count(input_node.get())) {
    state->full_backward = true; // the output does not depend on the input
    return SplitBackward(std::move(state));
  }
  const auto input_closure = walk_up(graph, input_node.get(), nullptr, nullptr);
  state->groups = plan_weight_pass(graph, input_closure, parameters);
  std::vector<at::Tensor> seeds;
  if (grad_output.defined()) {
    seeds.push_back(grad_output);
  }
  input_grad = torch::autograd::grad(
      {output},
      {input},
      seeds,
      /*retain_graph=*/true,
      /*create_graph=*/false,
      /*allow_unused=*/true)[0];
  return SplitBackward(std::move(state));
}

void SplitBackward::weight_pass() {
  if (!state_ || state_->done) {
    throw Error("SplitBackward::weight_pass: called twice, or on a moved-from object");
  }
  state_->done = true;
  if (state_->full_backward) {
    if (state_->output.requires_grad()) {
      std::vector<at::Tensor> seeds;
      if (state_->grad_output.defined()) {
        seeds.push_back(state_->grad_output);
      }
      torch::autograd::backward({state_->output}, seeds);
    }
  } else {
    for (auto& group : state_->groups) {
      weight_pass_of(group);
    }
  }
  state_.reset(); // releases the graph and the activations it holds
}

} // namespace largo::parallel
