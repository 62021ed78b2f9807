// Reading torch files: what Python's torch.save writes (a state_dict, a dict of tensors and
// scalars, a Largo checkpoint loaded and saved again in Python) and what torch::pickle_save
// and Largo's checkpoints write — one reader for both.
//
// Every entry's CRC-32 is checked (zip_archive.h), the pickle is read by a bounds-checked
// reader, and tensors come back on the CPU whatever device they were saved from. Python
// objects other than tensors, numbers, strings, lists, tuples and dicts (a numpy scalar, an
// argparse.Namespace) are refused with an error naming the object's type.
#pragma once

#include <largo/checkpoint/zip_archive.h>

#include <torch/torch.h>

#include <filesystem>

namespace largo::checkpoint {

// The value stored in the file. Throws CheckpointError naming the file: missing, a
// directory, empty, truncated, damaged (CRC), PyTorch's pre-1.6 format, a TorchScript
// module, or a Python object Largo cannot represent.
c10::IValue read_torch_file(const std::filesystem::path& path);
c10::IValue read_torch_file(const ZipArchive& archive);

} // namespace largo::checkpoint
