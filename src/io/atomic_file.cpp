#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace kivi::io {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

// The file a write to `path` should replace: the target of a symlink (followed to the
// end), else `path` itself.
std::string resolve_target(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    if (char* real = realpath(path.c_str(), nullptr)) {
      std::string r = real;
      std::free(real);
      return r;
    }
    // A dangling symlink: write where it points, relative to the link's folder.
    char buf[PATH_MAX];
    const ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
    if (n > 0) {
      const std::string link(buf, static_cast<size_t>(n));
      if (link[0] == '/') return link;
      const size_t slash = path.find_last_of('/');
      return slash == std::string::npos ? link : path.substr(0, slash + 1) + link;
    }
  }
  return path;
}

// The permission bits a new file gets: 0666 minus the umask.
mode_t default_mode() {
  const mode_t mask = umask(0);
  umask(mask);
  return 0666 & ~mask;
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  if (path.empty()) fail("no output file given");
  target_ = resolve_target(path);
  struct stat st;
  const bool exists = stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode))
    fail("cannot write '%s': it is a directory; give a file path", path.c_str());
  buf_.resize(kBufferBytes);
  if (exists && !S_ISREG(st.st_mode)) {
    // A device, pipe or socket (/dev/null, /dev/stdout): nothing to replace, so it is
    // written in place.
    fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot write '%s': %s", path.c_str(), std::strerror(errno));
    return;
  }
  const size_t slash = target_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : target_.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? target_ : target_.substr(slash + 1);
  std::string tmpl = dir + "." + name + ".tmp-XXXXXX";
  fd_ = mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd_ < 0) fail("cannot write '%s': %s", path.c_str(), std::strerror(errno));
  temp_ = tmpl;
  // mkostemp creates 0600; the output gets the target's bits, or the usual ones.
  if (fchmod(fd_, exists ? (st.st_mode & 07777) : default_mode()) != 0) {
    const int e = errno;
    abort();
    fail("cannot write '%s': %s", path.c_str(), std::strerror(e));
  }
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::flush_buffer() {
  size_t off = 0;
  while (off < used_) {
    const ssize_t n = ::write(fd_, buf_.data() + off, used_ - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write '%s': %s", path_.c_str(), std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  used_ = 0;
}

void AtomicFile::write(const void* data, size_t n) {
  if (done_) fail("internal: write to '%s' after it was committed or aborted", path_.c_str());
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t k = std::min(n, buf_.size() - used_);
    std::memcpy(buf_.data() + used_, p, k);
    used_ += k;
    written_ += k;
    p += k;
    n -= k;
    if (used_ == buf_.size()) flush_buffer();
  }
}

void AtomicFile::commit() {
  if (done_) fail("internal: '%s' committed twice or after abort", path_.c_str());
  try {
    flush_buffer();
    if (temp_.empty()) {  // written in place (not a regular file)
      const int fd = fd_;
      fd_ = -1;
      if (::close(fd) != 0) fail("cannot write '%s': %s", path_.c_str(), std::strerror(errno));
      done_ = true;
      return;
    }
    if (fsync(fd_) != 0) fail("cannot write '%s': %s", path_.c_str(), std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot write '%s': %s", path_.c_str(), std::strerror(errno));
    if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
      fail("cannot write '%s': %s", path_.c_str(), std::strerror(errno));
    }
  } catch (...) {
    abort();
    throw;
  }
  done_ = true;
  // Make the rename itself durable; a failure here leaves a complete file either way.
  const size_t slash = target_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : target_.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    ::close(dfd);
  }
}

void AtomicFile::abort() noexcept {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void check_output_is_not_input(const std::string& output, const std::vector<std::string>& inputs,
                               const char* option) {
  struct stat out;
  if (output.empty() || stat(output.c_str(), &out) != 0) return;  // a new file is nobody's input
  for (const auto& in : inputs) {
    struct stat st;
    if (in.empty() || stat(in.c_str(), &st) != 0) continue;
    if (st.st_dev == out.st_dev && st.st_ino == out.st_ino) {
      fail(
          "%s '%s' is the same file as the input '%s'; "
          "writing it would destroy the input (choose another output path)",
          option, output.c_str(), in.c_str());
    }
  }
}

void check_output_folder(const std::string& output, const char* option) {
  const size_t slash = output.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : output.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    fail("%s %s: the folder '%s' does not exist", option, output.c_str(), dir.c_str());
  if (!S_ISDIR(st.st_mode))
    fail("%s %s: '%s' is not a folder", option, output.c_str(), dir.c_str());
}

}  // namespace kivi::io
