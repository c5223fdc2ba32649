// sdf_check: load SDFormat files with libsdformat (sdf::Root::Load) and fail on any error.
//
//   build/sdf_check FILE...        (built by `make sdf-check`; Debian: libsdformat-dev, SDF <= 1.9)
//
// Strict: unrecognized elements and parser warnings count as errors (a Gazebo world must not rely
// on elements the parser ignores). `model://NAME` URIs are resolved through GZ_SIM_RESOURCE_PATH
// (colon-separated folders, as `gz sim` resolves them) and SDF_PATH. Prints every error with its
// file and line; exit 0 when every file loads cleanly, 1 when any has an error, 2 on bad usage.
#include <cstdlib>
#include <iostream>
#include <string>

#include <sdf/ParserConfig.hh>
#include <sdf/Root.hh>
#include <sdf/World.hh>

namespace {

sdf::ParserConfig strict_config() {
  sdf::ParserConfig config;
  config.SetWarningsPolicy(sdf::EnforcementPolicy::ERR);
  config.SetUnrecognizedElementsPolicy(sdf::EnforcementPolicy::ERR);
  config.SetDeprecatedElementsPolicy(sdf::EnforcementPolicy::ERR);
  if (const char *paths = std::getenv("GZ_SIM_RESOURCE_PATH")) {
    config.AddURIPath("model://", paths);
  }
  return config;
}

// Load one file; print its errors (or a one-line summary) and return how many there were.
int check(const std::string &path, const sdf::ParserConfig &config) {
  sdf::Root root;
  const sdf::Errors errors = root.Load(path, config);
  for (const auto &e : errors) {
    std::string message = e.Message();
    message.erase(message.find_last_not_of(" \n") + 1);   // libsdformat ends some with "\n"
    std::cerr << path << ": error: " << message;
    if (e.FilePath().has_value()) std::cerr << " [" << *e.FilePath();
    if (e.LineNumber().has_value()) std::cerr << ":" << *e.LineNumber();
    if (e.FilePath().has_value()) std::cerr << "]";
    std::cerr << "\n";
  }
  if (errors.empty()) {
    std::cout << "OK " << path << " (SDF " << root.Version() << ", " << root.WorldCount()
              << " world(s)";
    if (root.WorldCount() > 0) {
      const sdf::World *world = root.WorldByIndex(0);
      std::cout << ": \"" << world->Name() << "\" with " << world->ModelCount() << " model(s)";
    }
    std::cout << ")\n";
  }
  return static_cast<int>(errors.size());
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::cerr << "usage: sdf_check FILE...\n";
    return 2;
  }
  const sdf::ParserConfig config = strict_config();
  int total = 0;
  for (int i = 1; i < argc; ++i) total += check(argv[i], config);
  if (total > 0) std::cerr << total << " error(s)\n";
  return total > 0 ? 1 : 0;
}
