// registry.cpp: see registry.h.
#include "core/monitor/registry.h"

#include <stdexcept>

#include "core/monitor/exposition.h"

namespace cleave::monitor {

void Registry::declare(const std::string& name, MetricType type, const std::string& help) {
  if (!valid_metric_name(name)) throw std::invalid_argument("metric name '" + name + "' is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  if (type == MetricType::counter && (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0))
    throw std::invalid_argument("counter '" + name + "' must end in _total");
  std::lock_guard lock(mutex_);
  auto [it, inserted] = families_.try_emplace(name);
  if (!inserted) {
    if (it->second.type != type) throw std::invalid_argument("metric '" + name + "' was declared with another type");
    return;
  }
  it->second.name = name;
  it->second.help = help;
  it->second.type = type;
  order_.push_back(name);
}

void Registry::declare_table(std::string_view table) {
  struct Row {
    std::string name, type, help;
  };
  std::vector<Row> rows;
  while (!table.empty()) {
    const size_t end = table.find('\n');
    std::string_view line = table.substr(0, end);
    table = end == std::string_view::npos ? std::string_view() : table.substr(end + 1);
    if (line.find_first_not_of(' ') == std::string_view::npos) continue;
    if (line.front() == ' ') {  // the help goes on
      if (rows.empty()) throw std::invalid_argument("metrics table: a continued help before any metric");
      rows.back().help += ' ';  // (appended, not "+": GCC 12's -Wrestrict false positive)
      rows.back().help += line.substr(line.find_first_not_of(' '));
      continue;
    }
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos)
      throw std::invalid_argument("metrics table: '" + std::string(line) + "' is not NAME TYPE HELP");
    rows.push_back({std::string(line.substr(0, sp1)), std::string(line.substr(sp1 + 1, sp2 - sp1 - 1)),
                    std::string(line.substr(sp2 + 1))});
  }
  for (const Row& r : rows) {
    if (r.type != "counter" && r.type != "gauge")
      throw std::invalid_argument("metrics table: " + r.name + ": type '" + r.type + "' is not counter or gauge");
    declare(r.name, r.type == "counter" ? MetricType::counter : MetricType::gauge, r.help);
  }
}

Registry::Family& Registry::family(const std::string& name) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::invalid_argument("metric '" + name + "' was not declared");
  return it->second;
}

void Registry::check_labels(const Family& f, const Labels& labels) {
  for (const auto& [label, value] : labels)
    if (!valid_label_name(label)) throw std::invalid_argument("metric '" + f.name + "': bad label name '" + label + "'");
}

void Registry::set(const std::string& name, const Labels& labels, double value) {
  std::lock_guard lock(mutex_);
  Family& f = family(name);
  auto it = f.samples.find(labels);
  if (it == f.samples.end()) {
    check_labels(f, labels);
    f.samples.emplace(labels, value);
  } else {
    it->second = value;
  }
}

void Registry::add(const std::string& name, const Labels& labels, double delta) {
  std::lock_guard lock(mutex_);
  Family& f = family(name);
  if (f.type == MetricType::counter && !(delta > 0)) delta = 0;
  auto it = f.samples.find(labels);
  if (it == f.samples.end()) {
    check_labels(f, labels);
    f.samples.emplace(labels, delta);
  } else {
    it->second += delta;
  }
}

void Registry::set_only(const std::string& name, const Labels& labels, double value) {
  std::lock_guard lock(mutex_);
  Family& f = family(name);
  check_labels(f, labels);
  f.samples.clear();
  f.samples.emplace(labels, value);
}

void Registry::clear(const std::string& name) {
  std::lock_guard lock(mutex_);
  family(name).samples.clear();
}

double Registry::value(const std::string& name, const Labels& labels, double missing) const {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) return missing;
  auto s = it->second.samples.find(labels);
  return s == it->second.samples.end() ? missing : s->second;
}

Registry::Collection Registry::collect(std::function<void(Registry&)> collector) {
  std::lock_guard lock(collectors_mutex_);
  const uint64_t id = ++next_collector_;
  collectors_.emplace(id, std::move(collector));
  return Collection(this, id);
}

Registry::Collection& Registry::Collection::operator=(Collection&& other) noexcept {
  if (this != &other) {
    reset();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void Registry::Collection::reset() {
  if (!registry_) return;
  std::lock_guard lock(registry_->collectors_mutex_);
  registry_->collectors_.erase(id_);
  registry_ = nullptr;
}

std::string Registry::render() {
  {
    std::lock_guard lock(collectors_mutex_);
    for (auto& [id, collector] : collectors_) collector(*this);
  }
  std::lock_guard lock(mutex_);
  std::string out;
  for (const std::string& name : order_) {
    const Family& f = families_.at(name);
    out += "# HELP " + name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + name + (f.type == MetricType::counter ? " counter\n" : " gauge\n");
    for (const auto& [labels, value] : f.samples) {
      out += name;
      if (!labels.empty()) {
        out += '{';
        for (size_t i = 0; i < labels.size(); ++i)
          out += (i ? ",": "") + labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
        out += '}';
      }
      out += ' ' + format_value(value) + '\n';
    }
  }
  return out;
}

double RunningTotals::advance(const std::string& key, uint64_t now) {
  auto [it, fresh] = last_.try_emplace(key, 0);
  const uint64_t before = it->second;
  it->second = now;
  return static_cast<double>(!fresh && now >= before ? now - before : now);
}

}  // namespace cleave::monitor
