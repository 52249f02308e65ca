// test_exposition.cpp: core/monitor/exposition.h and registry.h — the
// Prometheus text format's rules (names, escaping, values) and what the
// registry renders: HELP and TYPE before the samples, samples by labels,
// counters that only grow, info gauges replaced at once, collectors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/monitor/exposition.h"
#include "core/monitor/registry.h"

using namespace cleave::monitor;

TEST_CASE("label values escape backslash, double quote and line feed, HELP escapes backslash and line feed",
          "[monitor]") {
  CHECK(escape_label_value(R"(C:\path)") == R"(C:\\path)");
  CHECK(escape_label_value(R"(say "hi")") == R"(say \"hi\")");
  CHECK(escape_label_value("two\nlines") == R"(two\nlines)");
  CHECK(escape_label_value("plain, {braces} = ok") == "plain, {braces} = ok");
  CHECK(escape_help("a \"quoted\" \\ help\nline") == "a \"quoted\" \\\\ help\\nline");
}

TEST_CASE("metric and label names follow the format's grammar", "[monitor]") {
  CHECK(valid_metric_name("cleaved_jobs_total"));
  CHECK(valid_metric_name("ns:sub_metric"));
  CHECK_FALSE(valid_metric_name(""));
  CHECK_FALSE(valid_metric_name("9lives"));
  CHECK_FALSE(valid_metric_name("has-dash"));
  CHECK(valid_label_name("kind"));
  CHECK_FALSE(valid_label_name("__reserved"));
  CHECK_FALSE(valid_label_name("a:b"));
}

TEST_CASE("sample values: whole numbers plain, others exact, NaN and infinities spelled as the format does",
          "[monitor]") {
  CHECK(format_value(0) == "0");
  CHECK(format_value(123456789012) == "123456789012");
  CHECK(format_value(-3) == "-3");
  CHECK(format_value(0.5) == "0.5");
  CHECK(std::stod(format_value(0.1)) == 0.1);
  CHECK(format_value(1e300) == "1.0000000000000001e+300");
  CHECK(format_value(std::nan("")) == "NaN");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
}

TEST_CASE("text for a label loses control characters and invalid UTF-8 and is cut at a character", "[monitor]") {
  CHECK(sanitize_label_text("bad\tthing\r\nhappened") == "bad thing  happened");
  CHECK(sanitize_label_text("caf\xc3\xa9 ok") == "caf\xc3\xa9 ok");
  CHECK(sanitize_label_text("junk \xff\xc3 end") == "junk ?? end");
  CHECK(sanitize_label_text("\xed\xa0\x80") == "???");  // a UTF-16 surrogate is not UTF-8
  const std::string cut = sanitize_label_text("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 7);  // 8 bytes into 7
  CHECK(cut == "\xc3\xa9\xc3\xa9...");
  CHECK(sanitize_label_text(std::string(1000, 'x')).size() == 256);
}

TEST_CASE("the registry renders HELP and TYPE, then the samples sorted by labels, with values escaped",
          "[monitor]") {
  Registry r;
  r.declare("demo_jobs_total", MetricType::counter, "Jobs run.\nBy kind.");
  r.declare("demo_last_error_info", MetricType::gauge, "The last error.");
  r.declare("demo_unused", MetricType::gauge, "Declared, never set.");
  r.add("demo_jobs_total", {{"kind", "stage"}}, 2);
  r.add("demo_jobs_total", {{"kind", "fed"}}, 1);
  r.add("demo_jobs_total", {{"kind", "stage"}}, 1);
  r.set_only("demo_last_error_info", {{"message", "link \"next\" at C:\\x\nclosed"}}, 1);
  CHECK(r.render() ==
        "# HELP demo_jobs_total Jobs run.\\nBy kind.\n"
        "# TYPE demo_jobs_total counter\n"
        "demo_jobs_total{kind=\"fed\"} 1\n"
        "demo_jobs_total{kind=\"stage\"} 3\n"
        "# HELP demo_last_error_info The last error.\n"
        "# TYPE demo_last_error_info gauge\n"
        "demo_last_error_info{message=\"link \\\"next\\\" at C:\\\\x\\nclosed\"} 1\n"
        "# HELP demo_unused Declared, never set.\n"
        "# TYPE demo_unused gauge\n");
}

TEST_CASE("counters only grow, info gauges are replaced, bad names and undeclared families are refused",
          "[monitor]") {
  Registry r;
  r.declare("c_total", MetricType::counter, "c");
  r.declare("g", MetricType::gauge, "g");
  r.add("c_total", {}, 5);
  r.add("c_total", {}, -3);
  CHECK(r.value("c_total", {}) == 5);
  r.set("g", {{"a", "1"}}, 7);
  r.set("g", {{"a", "1"}}, -2);
  CHECK(r.value("g", {{"a", "1"}}) == -2);
  r.set_only("g", {{"a", "2"}}, 1);
  CHECK(r.value("g", {{"a", "1"}}, -99) == -99);
  CHECK(r.value("g", {{"a", "2"}}) == 1);
  r.clear("g");
  CHECK(r.render().find("\ng{") == std::string::npos);
  CHECK_THROWS_AS(r.declare("jobs", MetricType::counter, "no _total"), std::invalid_argument);
  CHECK_THROWS_AS(r.declare("bad-name", MetricType::gauge, ""), std::invalid_argument);
  CHECK_THROWS_AS(r.declare("g", MetricType::counter, ""), std::invalid_argument);
  CHECK_NOTHROW(r.declare("g", MetricType::gauge, "again"));
  CHECK_THROWS_AS(r.set("never_declared", {}, 1), std::invalid_argument);
  CHECK_THROWS_AS(r.set("g", {{"bad-label", "x"}}, 1), std::invalid_argument);
}

TEST_CASE("collectors run at every render until their handle goes", "[monitor]") {
  Registry r;
  r.declare("reads", MetricType::gauge, "times collected");
  int calls = 0;
  {
    Registry::Collection handle = r.collect([&](Registry& reg) { reg.set("reads", {}, ++calls); });
    CHECK(r.render().find("\nreads 1\n") != std::string::npos);
    CHECK(r.render().find("\nreads 2\n") != std::string::npos);
  }
  r.render();
  CHECK(calls == 2);
}

TEST_CASE("running totals turn counts that start again into growth", "[monitor]") {
  RunningTotals t;
  CHECK(t.advance("link", 100) == 100);
  CHECK(t.advance("link", 150) == 50);
  CHECK(t.advance("link", 150) == 0);
  CHECK(t.advance("link", 20) == 20);  // went back: a new source
  t.restart();
  CHECK(t.advance("link", 500) == 500);  // a new job's link counts from its start
  CHECK(t.advance("other", 7) == 7);
}

TEST_CASE("a metrics table declares one family per line, help continued on indented lines", "[monitor]") {
  Registry r;
  r.declare_table(R"(
demo_jobs_total counter Jobs that ended,
  by kind.
demo_up gauge 1 while up.
)");
  CHECK(r.render() ==
        "# HELP demo_jobs_total Jobs that ended, by kind.\n# TYPE demo_jobs_total counter\n"
        "# HELP demo_up 1 while up.\n# TYPE demo_up gauge\n");
  CHECK_THROWS_WITH(r.declare_table("demo_x histogram Nope."), Catch::Contains("'histogram' is not counter or gauge"));
  CHECK_THROWS_WITH(r.declare_table("demo_y gauge"), Catch::Contains("is not NAME TYPE HELP"));
  CHECK_THROWS_WITH(r.declare_table("  orphan help"), Catch::Contains("before any metric"));
  CHECK_THROWS_AS(r.declare_table("demo_count counter Not ending in _total."), std::invalid_argument);
}
