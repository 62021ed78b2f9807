// Private to the config layer: VISSL's "<model>_fsdp" trunk and head names.
//
// VISSL registers an FSDP-wrapped copy of some of its models under another name
// (regnet_fsdp, vision_transformer_fsdp, xcit_fsdp trunks; swav_head_fsdp, mlp_fsdp,
// eval_mlp_fsdp, dino_head_fsdp heads): the same architecture, whose blocks FairScale's FSDP
// wraps as the model is built. They run only in VISSL's FSDP task (TRAINER.TASK_NAME
// self_supervision_fsdp_task, which MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP sets, renaming the
// plain models to these). Largo wraps any model it builds in FSDP when either key asks for
// FSDP (fsdp_requested), so such a name means the plain architecture, and it is accepted only
// under FSDP: without it the config asks for FSDP's model without FSDP, which VISSL would not
// run either, and is refused naming the keys to set. A _fsdp name whose plain model Largo
// lacks is refused naming that model.
#pragma once

#include <largo/core/config.h>

#include <string>

namespace largo::train {

// MODEL.TRUNK.NAME's architecture: the name itself, or for VISSL's <trunk>_fsdp the trunk.
std::string trunk_architecture(const Config& config);

// The architecture of MODEL.HEAD.PARAMS' head named `name` (`key` names the entry in
// messages): the name itself, or for VISSL's <head>_fsdp the head.
std::string
head_architecture(const Config& config, const std::string& name, const std::string& key);

} // namespace largo::train
