// Command-line options: declared once with their help text, so `--help` always lists
// every option, and anything undeclared is an error that names it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kivi::tools {

class Args {
 public:
  Args(std::string command, std::string synopsis, std::string description);

  // An option taking a value. `def` is shown in --help and returned when absent.
  void add(const std::string& long_name, char short_name, const std::string& metavar,
           const std::string& help, const std::string& def = "");
  // Replaces the metavar, help and default of a declared option.
  void replace(const std::string& long_name, const std::string& metavar, const std::string& help,
               const std::string& def);
  // Another spelling of a declared option, with its dashes: "-ctk" or "--cache-type-k"
  // (llama.cpp's names). Listed in --help beside the option.
  void alias(const std::string& spelled, const std::string& long_name);
  // A boolean flag.
  void add_flag(const std::string& long_name, char short_name, const std::string& help);
  // Positional arguments: names for the synopsis, min/max count.
  void positionals(const std::string& names, int min_count, int max_count);
  void section(const std::string& title);

  // Parses argv[first..argc). Throws kivi::Error for unknown options, missing values
  // and wrong positional counts. Returns false if --help was given.
  bool parse(int argc, char** argv, int first = 2);

  std::string help() const;
  // Whether the option was given; the name must be declared (a typo is an internal error).
  bool given(const std::string& name) const;
  bool declared(const std::string& name) const { return find_long(name) != nullptr; }
  bool flag(const std::string& name) const;
  std::string str(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const;
  double number(const std::string& name, double lo, double hi) const;
  std::vector<std::string> list(const std::string& name) const;  // comma-separated
  std::vector<int64_t> int_list(const std::string& name, int64_t lo, int64_t hi) const;
  const std::vector<std::string>& positional() const { return pos_; }
  const std::string& command() const { return command_; }

 private:
  struct Opt {
    std::string long_name;
    char short_name;
    std::string metavar, help, def;
    bool is_flag;
    std::string section;
    std::vector<std::string> aliases;
  };
  const Opt* find_long(const std::string& n) const;
  const Opt* find_alias(const std::string& spelled) const;
  std::vector<std::string> spellings() const;  // every --long and alias, for suggestions
  const Opt* find_short(char c) const;
  const Opt& spec(const std::string& name) const;

  std::string command_, synopsis_, description_;
  std::string pos_names_;
  int pos_min_ = 0, pos_max_ = 0;
  std::string current_section_ = "Options";
  std::vector<Opt> opts_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> pos_;
};

}  // namespace kivi::tools
