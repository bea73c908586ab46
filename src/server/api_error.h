// An error answered to an HTTP client in OpenAI's shape:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code":
//   null}}
// with the HTTP status that goes with it (400 bad request, 401 bad API key, 404 unknown
// model or route, 413 body too large, 503 overloaded, 500 internal).
#pragma once

#include <stdexcept>
#include <string>

namespace kivi::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "")
      : std::runtime_error(message),
        status_(status),
        param_(std::move(param)),
        code_(std::move(code)),
        type_(type.empty() ? default_type(status) : std::move(type)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }
  // The JSON body.
  std::string json() const;

  static std::string default_type(int status);

 private:
  int status_;
  std::string param_, code_, type_;
};

}  // namespace kivi::server
