// Early-return helpers for absl::Status / absl::StatusOr, used across module boundaries.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TC_CONCAT_INNER_(a, b) a##b
#define TC_CONCAT_(a, b) TC_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define TC_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status tc_status_ = (expr);          \
    if (!tc_status_.ok()) return tc_status_;     \
  } while (0)

// `TC_ASSIGN_OR_RETURN(auto x, F())` binds the value of an absl::StatusOr or returns its error.
#define TC_ASSIGN_OR_RETURN(lhs, expr) \
  TC_ASSIGN_OR_RETURN_IMPL_(TC_CONCAT_(tc_statusor_, __LINE__), lhs, expr)
#define TC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
