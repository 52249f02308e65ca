// accountant.cpp: see accountant.h. The series are ports of dp-accounting's
// rdp_privacy_accountant.py (_compute_log_a_int, _compute_log_a_frac,
// _log_erfc, compute_epsilon), kept in the same order of operations.
#include "core/fed/accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace cleave {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(x) + exp(y)).
double log_add(double x, double y) {
  const double a = std::min(x, y), b = std::max(x, y);
  if (a == -kInf) return b;
  return std::log1p(std::exp(a - b)) + b;
}

// log |binomial(n, k)| for real n, k (log-gamma is of the absolute value, as scipy's gammaln).
double log_comb(double n, double k) { return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1); }

// log(erfc(x)), accurate far into the tail.
double log_erfc(double x) {
  const double r = std::erfc(x);
  if (r > 0) return std::log(r);
  // erfc(x) ~ exp(-x^2 - .5/x^2 + .625/x^4 - ...) / (x sqrt(pi)) (Laurent series at infinity).
  return -std::log(M_PI) / 2 - std::log(x) - x * x - 0.5 / (x * x) + 0.625 / std::pow(x, 4) -
         37.0 / 24.0 / std::pow(x, 6) + 353.0 / 64.0 / std::pow(x, 8);
}

// log(A_alpha) for integer alpha, 0 < q < 1 (Mironov et al. 2019, Sec. 3.3).
double log_a_int(double q, double sigma, int alpha) {
  double log_a = -kInf;
  const double log1mq = std::log1p(-q);
  for (int i = 0; i <= alpha; ++i) {
    const double log_coef = log_comb(alpha, i) + i * std::log(q) + (alpha - i) * log1mq;
    const double s = log_coef + (static_cast<double>(i) * i - i) / (2 * sigma * sigma);
    log_a = log_add(log_a, s);
  }
  return log_a;
}

// log(A_alpha) for fractional alpha, 0 < q < 1: the two integrals over (-inf, z0] and [z0, inf).
double log_a_frac(double q, double sigma, double alpha) {
  double log_a0 = -kInf, log_a1 = -kInf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double log1mq = std::log1p(-q);
  double last_s0 = -kInf, last_s1 = -kInf;
  for (int i = 0; i < 1000; ++i) {
    const double log_coef = log_comb(alpha, i);
    const double j = alpha - i;
    const double log_t0 = log_coef + i * std::log(q) + j * log1mq;
    const double log_t1 = log_coef + j * std::log(q) + i * log1mq;
    const double log_e0 = std::log(0.5) + log_erfc((i - z0) / (std::sqrt(2.0) * sigma));
    const double log_e1 = std::log(0.5) + log_erfc((z0 - j) / (std::sqrt(2.0) * sigma));
    const double log_s0 = log_t0 + (static_cast<double>(i) * i - i) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    log_a0 = log_add(log_a0, log_s0);
    log_a1 = log_add(log_a1, log_s1);
    const double total = log_add(log_a0, log_a1);
    if (log_s0 < last_s0 && log_s1 < last_s1 && std::max(log_s0, log_s1) < total - 30) return total;
    last_s0 = log_s0;
    last_s1 = log_s1;
  }
  return kInf;  // did not converge: the order is left out (as dp-accounting does)
}

}  // namespace

std::vector<double> default_rdp_orders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int a = 11; a < 64; ++a) orders.push_back(a);
  for (double a : {128.0, 256.0, 512.0, 1024.0}) orders.push_back(a);
  return orders;
}

double rdp_sampled_gaussian(double q, double z, double alpha) {
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("sampling rate must be in [0, 1], got " + std::to_string(q));
  if (!(z >= 0)) throw std::invalid_argument("noise multiplier must be >= 0, got " + std::to_string(z));
  if (!(alpha > 1)) throw std::invalid_argument("Rényi order must exceed 1, got " + std::to_string(alpha));
  if (q == 0) return 0;
  if (std::isinf(alpha) || z == 0) return kInf;
  if (q == 1) return alpha / (2 * z * z);
  const double log_a = alpha == std::floor(alpha) ? log_a_int(q, z, static_cast<int>(alpha)) : log_a_frac(q, z, alpha);
  return log_a / (alpha - 1);
}

PrivacySpent epsilon_from_rdp(const std::vector<double>& orders, const std::vector<double>& rdp, double delta) {
  if (orders.size() != rdp.size() || orders.empty())
    throw std::invalid_argument("epsilon_from_rdp: " + std::to_string(orders.size()) + " orders but " +
                                std::to_string(rdp.size()) + " RDP values");
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("delta must be in (0, 1), got " + std::to_string(delta));
  PrivacySpent best{kInf, orders[0]};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i], r = rdp[i];
    double eps = kInf;
    if (r < 0 || delta * delta + std::expm1(-r) > 0)
      eps = 0;  // numerically negative RDP, or bounded through the KL divergence
    else if (a > 1.01)
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

RdpAccountant::RdpAccountant() : orders_(default_rdp_orders()), rdp_(orders_.size(), 0.0) {}

RdpAccountant::RdpAccountant(std::vector<double> rdp) : orders_(default_rdp_orders()), rdp_(std::move(rdp)) {
  if (rdp_.size() != orders_.size())
    throw std::invalid_argument("saved privacy accountant holds " + std::to_string(rdp_.size()) +
                                " RDP values, expected " + std::to_string(orders_.size()));
  for (double r : rdp_)
    if (!(r >= 0)) throw std::invalid_argument("saved privacy accountant holds a negative or NaN RDP value");
}

void RdpAccountant::compose(double q, double z, int rounds) {
  if (rounds < 0) throw std::invalid_argument("rounds must be >= 0");
  if (rounds == 0) return;  // (0 x an infinite RDP would be NaN)
  for (size_t i = 0; i < orders_.size(); ++i) rdp_[i] += rounds * rdp_sampled_gaussian(q, z, orders_[i]);
}

PrivacySpent RdpAccountant::spent_after(double q, double z, double delta) const {
  RdpAccountant next = *this;
  next.compose(q, z);
  return next.spent(delta);
}

}  // namespace cleave
