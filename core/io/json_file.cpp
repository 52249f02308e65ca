// json_file.cpp: see json_file.h.
#include "core/io/json_file.h"

#include "core/io/atomic_file.h"

namespace cleave {

void write_json_file(const std::string& path, const nlohmann::json& doc) {
  if (path.empty()) return;
  const std::string text = doc.dump(2) + "\n";
  AtomicFileWriter w(path);
  w.write(text.data(), text.size());
  w.commit();
}

}  // namespace cleave
