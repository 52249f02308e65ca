// test_devices_file.cpp: parsing, errors and round trip of the devices file.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/planner/devices_file.h"

using namespace cleave;
using nlohmann::json;

namespace {

const char* kExample = R"({
  "devices": [{"name": "jetson", "memory": "4G", "gflops": 400},
              {"name": "pi", "memory": 536870912, "gflops": 12},
              {"name": "laptop", "memory": "1.5GiB", "gflops": 150}],
  "links": [{"from": "jetson", "to": "pi", "mbps": 100, "latency_ms": 2},
            {"from": "pi", "to": "laptop", "mbps": 20, "latency_ms": 5},
            {"from": "laptop", "to": "pi", "mbps": 40, "latency_ms": 1, "encoding": "f16"}],
  "default_link": {"mbps": 1000, "latency_ms": 0.5}
})";

std::string parse_error(const std::string& text) {
  try {
    parse_cluster(json::parse(text), "devs.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("the issue's devices file parses", "[planner][devices_file]") {
  const Cluster c = parse_cluster(json::parse(kExample), "devs.json");
  REQUIRE(c.num_devices() == 3);
  CHECK(c.devices[0].name == "jetson");
  CHECK(c.devices[0].memory_bytes == int64_t{4} << 30);
  CHECK(c.devices[1].memory_bytes == 536870912);
  CHECK(c.devices[2].memory_bytes == int64_t{3} << 29);
  CHECK(c.devices[0].gflops == 400);
  CHECK(c.default_link.mbps == 1000);
  CHECK(c.default_link.latency_ms == 0.5);
  // jetson -> pi given: applies both ways.
  CHECK(c.link(0, 1).mbps == 100);
  CHECK(c.link(1, 0).mbps == 100);
  // pi -> laptop and laptop -> pi both given: each keeps its own.
  CHECK(c.link(1, 2).mbps == 20);
  CHECK(c.link(2, 1).mbps == 40);
  CHECK(c.link(2, 1).encoding == transport::Encoding::kF16);
  CHECK_FALSE(c.link(1, 2).encoding.has_value());
  // Not given: the default.
  CHECK(c.link(0, 2).mbps == 1000);
}

TEST_CASE("memory sizes", "[planner][devices_file]") {
  CHECK(parse_memory_size(json(123)) == 123);
  CHECK(parse_memory_size(json("512")) == 512);
  CHECK(parse_memory_size(json("4K")) == 4096);
  CHECK(parse_memory_size(json("512M")) == int64_t{512} << 20);
  CHECK(parse_memory_size(json("512MB")) == int64_t{512} << 20);
  CHECK(parse_memory_size(json("512MiB")) == int64_t{512} << 20);
  CHECK(parse_memory_size(json("2g")) == int64_t{2} << 30);
  CHECK(parse_memory_size(json("1T")) == int64_t{1} << 40);
  CHECK(parse_memory_size(json("0.5G")) == int64_t{1} << 29);
  CHECK_THROWS_AS(parse_memory_size(json("4X")), std::invalid_argument);
  CHECK_THROWS_AS(parse_memory_size(json("G")), std::invalid_argument);
  CHECK_THROWS_AS(parse_memory_size(json("-4G")), std::invalid_argument);
  CHECK_THROWS_AS(parse_memory_size(json(-5)), std::invalid_argument);
  CHECK_THROWS_AS(parse_memory_size(json(1.5)), std::invalid_argument);
  CHECK_THROWS_AS(parse_memory_size(json::array()), std::invalid_argument);
}

TEST_CASE("devices file errors name the file and the entry", "[planner][devices_file]") {
  CHECK_THAT(parse_error(R"([1])"), Catch::StartsWith("devs.json: "));
  CHECK_THAT(parse_error(R"({"devices": []})"), Catch::Contains("non-empty array"));
  CHECK_THAT(parse_error(R"({"devices": [{"memory": "1G", "gflops": 1}]})"),
             Catch::Contains("devices[0]: missing or empty \"name\""));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "gflops": 1}]})"),
             Catch::Contains("devices[0] ('a'): missing field 'memory'"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "4X", "gflops": 1}]})"),
             Catch::Contains("devices[0] ('a'): memory: unknown size suffix"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 0}]})"),
             Catch::Contains("devices[0] ('a'): gflops"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G"}]})"),
             Catch::Contains("missing field 'gflops'"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1},
                                         {"name": "a", "memory": "1G", "gflops": 1}]})"),
             Catch::Contains("devices[1] ('a'): duplicate device name"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflop": 1}]})"),
             Catch::Contains("unknown field 'gflop'"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1}],
                             "links": [{"from": "a", "to": "b", "mbps": 10}]})"),
             Catch::Contains("links[0]: to: no device named 'b'"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1},
                                         {"name": "b", "memory": "1G", "gflops": 1}],
                             "links": [{"from": "a", "to": "b", "mbps": -10}]})"),
             Catch::Contains("links[0] (a -> b): mbps"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1},
                                         {"name": "b", "memory": "1G", "gflops": 1}],
                             "links": [{"from": "a", "to": "b", "mbps": 10}, {"from": "a", "to": "b", "mbps": 5}]})"),
             Catch::Contains("links[1] (a -> b): this link is given twice"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1}],
                             "default_link": {"mbps": 10, "latency_ms": "x"}})"),
             Catch::Contains("default_link: latency_ms: expected a number"));
  CHECK_THAT(parse_error(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "layer_seconds": [0.1, -1]}]})"),
             Catch::Contains("layer_seconds[1]"));
}

TEST_CASE("devices file round-trips through the writer", "[planner][devices_file]") {
  Cluster c = parse_cluster(json::parse(kExample), "devs.json");
  c.devices[1].layer_seconds_per_sample = std::vector<double>{1e-4, 2e-4};
  const std::string path = (std::filesystem::temp_directory_path() / "cleave_test_devices.json").string();
  write_devices_file(path, c);
  const Cluster back = load_cluster(path);
  std::remove(path.c_str());
  REQUIRE(back.num_devices() == 3);
  for (int k = 0; k < 3; ++k) {
    CHECK(back.devices[k].name == c.devices[k].name);
    CHECK(back.devices[k].memory_bytes == c.devices[k].memory_bytes);
    CHECK(back.devices[k].gflops == c.devices[k].gflops);
    for (int j = 0; j < 3; ++j) {
      if (j == k) continue;
      CHECK(back.link(k, j).mbps == c.link(k, j).mbps);
      CHECK(back.link(k, j).latency_ms == c.link(k, j).latency_ms);
      CHECK(back.link(k, j).encoding == c.link(k, j).encoding);
    }
  }
  CHECK(back.devices[1].layer_seconds_per_sample == c.devices[1].layer_seconds_per_sample);
}

TEST_CASE("devices file: a link's CPU rate", "[planner][devices_file]") {
  const json doc = json::parse(R"({"devices": [{"name": "a", "memory": "1GB", "gflops": 1},
                                                {"name": "b", "memory": "1GB", "gflops": 1}],
                                   "links": [{"from": "a", "to": "b", "mbps": 20, "cpu_mbps": 4000}],
                                   "default_link": {"mbps": 1000}})");
  const Cluster c = parse_cluster(doc, "devs.json");
  REQUIRE(c.link(0, 1).cpu_mbps.has_value());
  CHECK(*c.link(0, 1).cpu_mbps == 4000);
  CHECK(*c.link(1, 0).cpu_mbps == 4000);  // symmetric unless the reverse is given
  CHECK_FALSE(c.default_link.cpu_mbps.has_value());
  const std::string path = (std::filesystem::temp_directory_path() / "cleave_test_cpu_mbps.json").string();
  write_devices_file(path, c);
  const Cluster back = load_cluster(path);
  std::remove(path.c_str());
  CHECK(back.link(0, 1).cpu_mbps == c.link(0, 1).cpu_mbps);
  json bad = doc;
  bad["links"][0]["cpu_mbps"] = 0;
  CHECK_THROWS_WITH(parse_cluster(bad, "devs.json"), Catch::Contains("cpu_mbps: expected a positive rate"));
  bad["links"][0]["cpu_mbps"] = "fast";
  CHECK_THROWS_WITH(parse_cluster(bad, "devs.json"), Catch::Contains("cpu_mbps: expected a number"));
}

TEST_CASE("devices file: optimizer update time and shared machines", "[planner][devices_file]") {
  const json doc = json::parse(R"({"devices": [
      {"name": "a", "memory": "1G", "gflops": 10, "update_seconds_per_param": 2e-9,
       "host": "box", "host_cores": 2, "cpu_threads": 1},
      {"name": "b", "memory": "1G", "gflops": 10}]})");
  const Cluster c = parse_cluster(doc, "devs.json");
  CHECK(c.devices[0].update_seconds_per_param == 2e-9);
  CHECK(c.devices[0].host == "box");
  CHECK(c.devices[0].host_cores == 2);
  CHECK(c.devices[0].cpu_threads == 1);
  CHECK(c.devices[1].host.empty());
  const json back = cluster_to_json(c);
  CHECK(back["devices"][0]["host"] == "box");
  CHECK(back["devices"][0]["update_seconds_per_param"] == 2e-9);
  CHECK_FALSE(back["devices"][1].contains("host"));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "host_cores": 2}]})"),
                                  "devs.json"),
                    Catch::Contains("devs.json") && Catch::Contains("need \"host\""));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "host": "x", "host_cores": 0, "cpu_threads": 1}]})"),
                                  "devs.json"),
                    Catch::Contains("host_cores"));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "update_seconds_per_param": -1}]})"),
                                  "devs.json"),
                    Catch::Contains("update_seconds_per_param"));
  // A measured contention between the host's devices comes back; below 1 or without a host it is an error.
  Cluster contended = c;
  contended.devices[0].host_contention = 1.3;
  const Cluster again = parse_cluster(cluster_to_json(contended), "devs.json");
  CHECK(again.devices[0].host_contention == 1.3);
  CHECK_FALSE(again.devices[1].host_contention);
  CHECK_FALSE(c.devices[0].host_contention);
  CHECK_FALSE(cluster_to_json(c)["devices"][0].contains("host_contention"));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "host": "x", "host_cores": 2, "cpu_threads": 1, "host_contention": 0}]})"),
                                  "devs.json"),
                    Catch::Contains("host_contention must be > 0"));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "host_contention": 1.2}]})"),
                                  "devs.json"),
                    Catch::Contains("need \"host\""));
}

TEST_CASE("devices file: a device's backend, and the encodings' aliases", "[planner][devices_file]") {
  const Cluster c = parse_cluster(json::parse(R"({"devices": [
      {"name": "a", "memory": "1G", "gflops": 1, "backend": "cuda"},
      {"name": "b", "memory": "1G", "gflops": 1}],
      "default_link": {"mbps": 100, "encoding": "int8"}})"), "devs.json");
  CHECK(c.devices[0].backend == Backend::cuda);
  CHECK_FALSE(c.devices[1].backend.has_value());
  CHECK(c.default_link.encoding == transport::Encoding::kInt8);
  const json back = cluster_to_json(c);
  CHECK(back["devices"][0]["backend"] == "cuda");
  CHECK_FALSE(back["devices"][1].contains("backend"));
  CHECK(back["default_link"]["encoding"] == "int8");
  CHECK(parse_cluster(back, "back").devices[0].backend == Backend::cuda);
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1, "backend": "tpu"}]})"),
                                  "devs.json"),
                    Catch::Contains("devices[0] ('a'): backend: expected \"cpu\", \"opencl\" or \"cuda\""));
  CHECK_THROWS_WITH(parse_cluster(json::parse(R"({"devices": [{"name": "a", "memory": "1G", "gflops": 1}],
                                                  "default_link": {"mbps": 1, "encoding": "bf16"}})"),
                                  "devs.json"),
                    Catch::Contains("unknown encoding 'bf16'"));
}

TEST_CASE("a missing devices file is a clear error", "[planner][devices_file]") {
  CHECK_THROWS_WITH(load_cluster("/nonexistent/devs.json"), Catch::StartsWith("/nonexistent/devs.json: cannot open"));
}
