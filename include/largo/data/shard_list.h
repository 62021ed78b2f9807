// A shard list as WebDataset users write it, expanded into tar file paths:
//   train-{000000..001023}.tar   a numeric range, zero-padded to the width of its first
//                                bound (webdataset's braceexpand); ranges may descend
//   {train,extra}-{0..3}.tar     alternatives; several braces expand as a product, left to
//                                right, in the order written
//   /data/shards/*.tar           a glob (*, ?, [...]): its matches, sorted by name
// A brace expansion's results may be globs too. Nothing is opened here except the
// directories a glob reads.
#pragma once

#include <string>
#include <vector>

namespace largo::data {

// The brace expansion of `pattern` alone, in order. Throws DataError naming the pattern for
// an unclosed brace or a range whose bounds are not integers.
std::vector<std::string> expand_braces(const std::string& pattern);

// The tar files `pattern` names: its brace expansion, each result that holds a glob
// character replaced by its sorted matches. Throws DataError naming the pattern when a glob
// matches nothing, a named file does not exist, or the list is empty.
std::vector<std::string> expand_shard_list(const std::string& pattern);

} // namespace largo::data
