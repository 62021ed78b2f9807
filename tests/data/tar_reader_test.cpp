// TarReader: members and offsets from the headers alone, in the three formats Python's
// tarfile writes (ustar with a name prefix, GNU long names, pax), and errors that name the
// tar file and the member.
#include <cstdlib>
#include <functional>

#include <gtest/gtest.h>

#include "data/tar_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/tar_reader.h"

namespace largo::data::tar_reader_test {
namespace {

using testing::TarEntry;
using testing::TempDir;

std::vector<TarMember> all_members(TarReader& tar) {
  std::vector<TarMember> members;
  while (auto member = tar.next()) {
    members.push_back(*member);
  }
  return members;
}

TEST(TarReader, ListsRegularMembersWithTheirDataAndSkipsDirectories) {
  TempDir dir;
  const auto path = dir.path() / "a.tar";
  testing::write_tar(
      path,
      {{"d/", {}, '5'},
       {"d/x.cls", testing::text_bytes("7")},
       {"d/x.bin", std::vector<uint8_t>(700, 3)},
       {"link", {}, '2'},
       {"y.txt", testing::text_bytes("hello")}});
  TarReader tar(path.string());
  const std::vector<TarMember> members = all_members(tar);
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "d/x.cls");
  EXPECT_EQ(members[0].data_offset, 2 * 512);
  EXPECT_EQ(members[1].name, "d/x.bin");
  EXPECT_EQ(members[1].size, 700);
  EXPECT_EQ(members[1].data_offset, 4 * 512);
  EXPECT_EQ(members[2].name, "y.txt");
  std::vector<uint8_t> bytes;
  tar.read(members[2], bytes);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "hello");
  tar.read(members[1], bytes);
  EXPECT_EQ(bytes, std::vector<uint8_t>(700, 3));
}

// Names longer than 100 bytes as each of tarfile's formats stores them: USTAR splits them
// into prefix + name, GNU writes a ././@LongLink member, PAX an extended header.
TEST(TarReader, ReadsLongNamesOfPythonTarfilesUstarGnuAndPaxFormats) {
  TempDir dir;
  const std::string script = R"(
import io, sys, tarfile
out = sys.argv[1]
name = "a" * 60 + "/" + "b" * 60 + "/sample.jpg"       # 126 bytes: ustar's prefix
longer = "c" * 180 + ".cls"                             # 184 bytes: no '/' to split at
for fmt, tag in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"),
                 (tarfile.PAX_FORMAT, "pax")):
    with tarfile.open(f"{out}/{tag}.tar", "w", format=fmt) as tar:
        for n, data in ((name, b"image"), (longer, b"12")):
            if fmt == tarfile.USTAR_FORMAT and n == longer:
                continue
            info = tarfile.TarInfo(n); info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
)";
  const auto script_path = dir.path() / "make.py";
  testing::write_bytes(script_path, testing::text_bytes(script));
  if (std::system(("python3 " + script_path.string() + " " + dir.path().string()).c_str()) != 0) {
    GTEST_SKIP() << "python3 with tarfile is not available";
  }
  const std::string name = std::string(60, 'a') + "/" + std::string(60, 'b') + "/sample.jpg";
  for (const std::string tag : {"ustar", "gnu", "pax"}) {
    TarReader tar((dir.path() / (tag + ".tar")).string());
    const std::vector<TarMember> members = all_members(tar);
    ASSERT_EQ(members.size(), tag == "ustar" ? 1u : 2u) << tag;
    EXPECT_EQ(members[0].name, name) << tag;
    std::vector<uint8_t> bytes;
    tar.read(members[0], bytes);
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "image") << tag;
    if (tag != "ustar") {
      EXPECT_EQ(members[1].name, std::string(180, 'c') + ".cls") << tag;
      tar.read(members[1], bytes);
      EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "12") << tag;
    }
  }
}

TEST(TarReader, ATruncatedMemberNamesTheFileAndTheMember) {
  TempDir dir;
  const auto path = dir.path() / "cut.tar";
  std::vector<uint8_t> bytes = testing::tar_bytes(
      {{"k0.png", std::vector<uint8_t>(600, 1)}, {"k1.png", std::vector<uint8_t>(3000, 2)}});
  bytes.resize(512 + 1024 + 512 + 1000); // k1.png's data stops after 1000 of 3000 bytes
  testing::write_bytes(path, bytes);
  TarReader tar(path.string());
  ASSERT_TRUE(tar.next().has_value());
  const std::string message = testing::data_error_of([&] { tar.next(); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("k1.png"), std::string::npos) << message;

  // A header cut short: named by the member before it.
  bytes.resize(512 + 1024 + 100);
  testing::write_bytes(path, bytes);
  TarReader cut_header(path.string());
  ASSERT_TRUE(cut_header.next().has_value());
  const std::string header_message = testing::data_error_of([&] { cut_header.next(); });
  EXPECT_NE(header_message.find("after k0.png"), std::string::npos) << header_message;
}

TEST(TarReader, ACorruptHeaderOrAFileThatIsNotATarIsNamed) {
  TempDir dir;
  const auto path = dir.path() / "bad.tar";
  std::vector<uint8_t> bytes = testing::tar_bytes({{"k0.cls", testing::text_bytes("1")}});
  bytes[10] ^= 0x20; // the name changes, the stored checksum does not
  testing::write_bytes(path, bytes);
  TarReader tar(path.string());
  const std::string message = testing::data_error_of([&] { tar.next(); });
  EXPECT_NE(message.find("bad header checksum"), std::string::npos) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;

  testing::write_bytes(path, std::vector<uint8_t>(2048, 'x'));
  TarReader text(path.string());
  EXPECT_NE(testing::data_error_of([&] { text.next(); }).find("not a tar file"), std::string::npos);
  EXPECT_NE(
      testing::data_error_of([&] {
        TarReader((dir.path() / "missing.tar").string());
      }).find("missing.tar: cannot open"),
      std::string::npos);
}

} // namespace
} // namespace largo::data::tar_reader_test
