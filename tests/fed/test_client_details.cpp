// test_client_details.cpp: a registration's federated details
// (core/fed/client_details.h) read as untrusted input: what the daemon
// writes is read back, a daemon without data is no client, and each wrong
// type is a refusal naming the field (the finding: "shard": 7 killed cleave
// fed with a raw json type_error).
#include <catch2/catch.hpp>

#include "core/fed/client_details.h"

using namespace cleave;
using Catch::Contains;
using nlohmann::json;

TEST_CASE("federated registration details are read with their types checked", "[fed]") {
  const FedClientDetails d = read_fed_client_details(
      json::parse(R"({"fed_client": true, "samples": 1000, "shard": "1/3", "partition": "iid", "dataset": "fm"})"));
  CHECK(d.fed_client);
  CHECK(d.samples == 1000);
  CHECK(d.shard == "1/3");
  CHECK(d.partition == "iid");
  CHECK_FALSE(read_fed_client_details(json::parse(R"({"device": "x"})")).fed_client);

  auto error = [](const std::string& text) {
    try {
      (void)read_fed_client_details(json::parse(text));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error(R"({"fed_client": true, "samples": 10, "shard": 7})") ==
        "registration details: \"shard\" must be a string like \"1/3\", got a number");
  CHECK_THAT(error(R"({"fed_client": true, "samples": 10, "shard": "seven"})"), Contains("got \"seven\""));
  CHECK_THAT(error(R"({"fed_client": true, "shard": "0/1"})"), Contains("\"samples\" must be an integer") &&
                                                                   Contains("missing"));
  CHECK_THAT(error(R"({"fed_client": true, "samples": -1})"), Contains("\"samples\" must be an integer"));
  CHECK_THAT(error(R"({"fed_client": "yes"})"), Contains("\"fed_client\" must be true or false, got a string"));
  CHECK_THAT(error(R"({"fed_client": true, "samples": 1, "partition": []})"), Contains("\"partition\""));
  // A parse refusal from the session is passed on as it is.
  CHECK_THROWS_WITH(read_fed_client_details(json::object(), "registration details: too deep"),
                    "registration details: too deep");
}
