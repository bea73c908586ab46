// Slots, as llama-server exposes them: GET /slots lists what each sequence slot holds,
// and POST /slots/{id}?action=save|restore|erase saves the cache an ended request left in
// a slot (the prefix cache's) to a KV file under --slot-save-path, restores one into a
// slot (a later request whose prompt starts with its tokens resumes from it: a
// conversation set aside and taken up again, across restarts), or frees the slot.
#pragma once

#include <string>
#include <vector>

#include "runtime/scheduler.h"

namespace kivi::server {

// The body of GET /slots.
std::string slots_body(const std::vector<runtime::Scheduler::SlotInfo>& slots, int ctx);

// The body of POST /slots/{id}?action=ACTION with JSON `body` ({"filename": NAME} for save
// and restore); files live in `dir` ("" = saving is off). Throws ApiError: an unknown
// action, a bad or missing filename, a slot out of range (404), running (409) or empty, no
// room in the pool (503), a file that is missing (404) or does not fit this server.
std::string slot_action(runtime::Scheduler& s, int id, const std::string& action,
                        const std::string& body, const std::string& dir);

}  // namespace kivi::server
