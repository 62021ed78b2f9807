// Builds a Largo model and optimizer from a config and takes one SGD step on random data.
#include <largo/core/config.h>
#include <largo/models/model_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  largo::Config config = largo::Config::load({}, {"OPTIMIZER.momentum=0.5"});
  largo::models::ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = 1;
  options.image_size = 28;
  options.num_classes = 10;
  auto model = largo::models::build_model(options);

  largo::optim::ParamGroupOptions group_options;
  largo::optim::SGDOptions sgd;
  sgd.momentum = config.get_double("OPTIMIZER.momentum");
  largo::optim::SGD optimizer(largo::optim::build_param_groups(*model, group_options), sgd);

  auto loss = torch::nn::functional::cross_entropy(model->forward(torch::randn({4, 1, 28, 28})),
                                                   torch::tensor({0, 1, 2, 3}));
  loss.backward();
  optimizer.step();
  std::cout << "consumer ok: loss " << loss.item<float>() << "\n";
  return 0;
}
