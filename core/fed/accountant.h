// accountant.h: the privacy loss of DP-FedAvg rounds (issue 18).
//
// Rényi differential privacy (RDP) of the Poisson-subsampled Gaussian
// mechanism (Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of the
// Sampled Gaussian Mechanism"), composed over rounds by adding the RDP at each
// order, and converted to (epsilon, delta) with the improved conversion of
// Canonne, Kamath, Steinke 2020 (Prop. 12) / Asoodeh et al. 2020 (eq. 20):
//   epsilon = min over orders a > 1.01 of  rdp(a) + log1p(-1/a) - log(delta * a) / (a - 1).
// The arithmetic (the orders, the integer and fractional series, the
// conversion) follows Google's `dp-accounting` package (0.6.0,
// dp_accounting.rdp.RdpAccountant with ADD_OR_REMOVE_ONE neighbours), so the
// two agree to rounding; tests/fed/test_accountant.cpp checks that against
// numbers that package computed (tests/fed/make_accountant_reference.py).
//
// One round of DP-FedAvg is one sampled Gaussian event: q = the share of
// clients sampled, z = noise standard deviation / clip norm.
#pragma once

#include <vector>

namespace cleave {

// dp-accounting's DEFAULT_RDP_ORDERS: 1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256, 512, 1024.
std::vector<double> default_rdp_orders();

// RDP at order `alpha` (> 1) of one Poisson-sampled Gaussian event with
// sampling rate q in [0, 1] and noise multiplier z >= 0; +inf when z == 0 (or
// a series does not converge). Throws std::invalid_argument outside those ranges.
double rdp_sampled_gaussian(double q, double z, double alpha);

struct PrivacySpent {
  double epsilon = 0;  // +inf when no order gives a bound
  double order = 0;    // the order that gave it
};

// (epsilon, delta) from RDP values at `orders` (same length), delta in (0, 1).
// Throws std::invalid_argument for mismatched lengths or delta outside (0, 1).
PrivacySpent epsilon_from_rdp(const std::vector<double>& orders, const std::vector<double>& rdp, double delta);

// The running total of a sequence of sampled Gaussian events.
class RdpAccountant {
 public:
  RdpAccountant();  // default_rdp_orders(), nothing spent
  // Resumes from RDP values saved with rdp(); throws std::invalid_argument when
  // their count does not match the orders, or one is negative or NaN.
  explicit RdpAccountant(std::vector<double> rdp);

  // Adds `rounds` events of sampling rate q and noise multiplier z.
  void compose(double q, double z, int rounds = 1);
  PrivacySpent spent(double delta) const { return epsilon_from_rdp(orders_, rdp_, delta); }
  // What spent() would say after one more event of (q, z); this one is unchanged.
  PrivacySpent spent_after(double q, double z, double delta) const;

  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

}  // namespace cleave
