#include "server/slots.h"

#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_body.h"

namespace kivi::server {

using nlohmann::json;
using runtime::Scheduler;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A file name inside the slot directory: letters, digits, '.', '_' and '-', not starting
// with '.', so that no name leaves the directory or hides in it.
std::string filename_of(const std::string& body) {
  const json b = json_object_body(body);
  const auto it = b.find("filename");
  if (it == b.end() || it->is_null())
    throw ApiError(400, "'filename' is required: the slot file's name", "filename");
  if (!it->is_string()) throw ApiError(400, "'filename' must be a string", "filename");
  const std::string name = it->get<std::string>();
  bool ok = !name.empty() && name.size() <= 200 && name[0] != '.';
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    throw ApiError(400,
                   "'filename' must be 1 to 200 letters, digits, '.', '_' or '-', not starting "
                   "with '.'",
                   "filename");
  }
  return name;
}

// A SlotError as the HTTP answer it stands for.
ApiError slot_error(const Scheduler::SlotError& e) {
  switch (e.kind) {
    case Scheduler::SlotError::kNoSlot:
      return ApiError(404, e.what(), "id_slot", "slot_not_found");
    case Scheduler::SlotError::kBusy:
      return ApiError(409, e.what(), "id_slot", "slot_busy");
    case Scheduler::SlotError::kEmpty:
      return ApiError(400, e.what(), "id_slot", "slot_empty");
    case Scheduler::SlotError::kNoRoom:
      return ApiError(503, e.what(), "", "kv_pool_full");
    case Scheduler::SlotError::kOff:
      break;
  }
  return ApiError(400, e.what(), "", "slots_unavailable");
}

// A message about `path` that names the file as the client did, not where it lies.
std::string named(std::string msg, const std::string& path, const std::string& name) {
  for (size_t at = msg.find(path); at != std::string::npos; at = msg.find(path, at + name.size()))
    msg.replace(at, path.size(), name);
  return msg;
}

double ms(double seconds) { return std::round(seconds * 1e6) / 1e3; }

}  // namespace

std::string slots_body(const std::vector<Scheduler::SlotInfo>& slots, int ctx) {
  json out = json::array();
  for (const auto& s : slots) {
    out.push_back({{"id", s.id},
                   {"n_ctx", ctx},
                   {"is_processing", s.processing},
                   {"n_tokens", s.tokens},
                   {"n_prompt_tokens", s.n_prompt},
                   {"n_decoded", s.n_generated}});
  }
  return dump(out);
}

std::string slot_action(Scheduler& s, int id, const std::string& action, const std::string& body,
                        const std::string& dir) {
  try {
    if (action == "erase") {
      const Scheduler::SlotResult r = s.erase_slot(id);
      return dump({{"id_slot", id}, {"n_erased", r.tokens}});
    }
    if (action != "save" && action != "restore") {
      throw ApiError(400,
                     action.empty()
                         ? "'action' is required: save, restore or erase"
                         : "unknown action '" + action + "' (valid: save, restore, erase)",
                     "action");
    }
    if (dir.empty()) {
      throw ApiError(400,
                     "slot files are off: start the server with --slot-save-path DIR to save and "
                     "restore slots",
                     "", "slots_unavailable");
    }
    const std::string name = filename_of(body);
    const std::string path = dir + "/" + name;
    try {
      if (action == "save") {
        const Scheduler::SlotResult r = s.save_slot(id, path);
        return dump({{"id_slot", id},
                     {"filename", name},
                     {"n_saved", r.tokens},
                     {"n_written", r.bytes},
                     {"timings", {{"save_ms", ms(r.seconds)}}}});
      }
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0)
        throw ApiError(404, "no slot file '" + name + "'", "filename", "file_not_found");
      const Scheduler::SlotResult r = s.restore_slot(id, path);
      return dump({{"id_slot", id},
                   {"filename", name},
                   {"n_restored", r.tokens},
                   {"n_read", r.bytes},
                   {"timings", {{"restore_ms", ms(r.seconds)}}}});
    } catch (const Scheduler::SlotError&) {
      throw;
    } catch (const Error& e) {
      throw ApiError(400, named(e.what(), path, name), "filename", "invalid_slot_file");
    }
  } catch (const Scheduler::SlotError& e) {
    throw slot_error(e);
  }
}

}  // namespace kivi::server
