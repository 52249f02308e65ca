// registry.h: a process's metrics — counters and gauges with labels — and
// their rendering as Prometheus text (exposition format 0.0.4), for
// http_server.h to serve.
//
// Whoever owns a value writes it here from its own thread (set, add,
// set_only); the scraping thread renders. Values that are cheap and safe to
// read from any thread (atomic transport counters, a device's bytes in use)
// can instead be read at scrape time by a collector (collect()). Everything
// is thread-safe.
//
// Families render in the order they were declared, each with its HELP and
// TYPE lines (also while it has no sample yet), samples sorted by labels.
// Counters only grow: sources that count from 0 again (each job's links, each
// run's endpoint) go through a RunningTotals first.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cleave::monitor {

enum class MetricType { counter, gauge };

// Label (name, value) pairs, e.g. {{"kind", "stage"}}; the order given is the order rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Declares a family. Declaring it again with the same type is a no-op (the
  // first help stays). Throws std::invalid_argument for a name the format
  // does not allow, a counter not ending in "_total", or another type.
  void declare(const std::string& name, MetricType type, const std::string& help);
  // Declares one family per line of `table`: "NAME TYPE HELP...", TYPE
  // `counter` or `gauge`; a line that starts with a space continues the help
  // of the line before; blank lines are skipped. Throws as declare() does, and
  // std::invalid_argument for a line without a name, a type and a help.
  void declare_table(std::string_view table);

  // The sample of `name` with `labels` becomes `value` / grows by `delta`
  // (a counter never shrinks: a negative delta is ignored). Throws
  // std::invalid_argument for an undeclared family or a bad label name.
  void set(const std::string& name, const Labels& labels, double value);
  void add(const std::string& name, const Labels& labels, double delta);
  // The family's only sample becomes (labels, value): an "info" gauge whose
  // label changes (the current job kind, the last error), replaced at once
  // so no scrape sees none or two.
  void set_only(const std::string& name, const Labels& labels, double value);
  // Drops every sample of the family (its HELP and TYPE stay).
  void clear(const std::string& name);
  // The sample's value, or `missing` when there is none (for tests and for sources that fold totals).
  double value(const std::string& name, const Labels& labels, double missing = 0) const;

  // A collector runs at every render, on the scraping thread, before the text
  // is made; it writes with set()/add(). It is unregistered when the returned
  // handle is destroyed (waiting for a render that is running it), so it may
  // read objects that outlive the handle.
  class Collection {
   public:
    Collection() = default;
    Collection(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
    Collection(Collection&& other) noexcept : registry_(std::exchange(other.registry_, nullptr)), id_(other.id_) {}
    Collection& operator=(Collection&& other) noexcept;
    Collection(const Collection&) = delete;
    Collection& operator=(const Collection&) = delete;
    ~Collection() { reset(); }
    void reset();

   private:
    Registry* registry_ = nullptr;
    uint64_t id_ = 0;
  };
  [[nodiscard]] Collection collect(std::function<void(Registry&)> collector);

  // Runs the collectors, then renders every family (text format 0.0.4).
  std::string render();

 private:
  struct Family {
    std::string name, help;
    MetricType type = MetricType::gauge;
    std::map<Labels, double> samples;
  };
  Family& family(const std::string& name);  // mutex_ held; throws for an undeclared one
  static void check_labels(const Family& f, const Labels& labels);

  mutable std::mutex mutex_;  // families_, order_
  std::map<std::string, Family> families_;
  std::vector<std::string> order_;
  std::mutex collectors_mutex_;  // held while collectors run: unregistering waits for them
  std::map<uint64_t, std::function<void(Registry&)>> collectors_;
  uint64_t next_collector_ = 0;
};

// Turns counts that start again from 0 — a job's link statistics, a run's
// endpoint — into the growth a counter adds: advance() returns how much
// `now` grew since the last call for `key`, all of it after restart() (a new
// source) or when it went back.
class RunningTotals {
 public:
  double advance(const std::string& key, uint64_t now);
  void restart() { last_.clear(); }

 private:
  std::map<std::string, uint64_t> last_;
};

}  // namespace cleave::monitor
