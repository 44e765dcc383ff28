#include "shared/runtime/linear.h"

namespace thermocline {

std::string_view ProjectionName(Projection p) {
  switch (p) {
    case Projection::kQ:
      return "q";
    case Projection::kK:
      return "k";
    case Projection::kV:
      return "v";
    case Projection::kO:
      return "o";
    case Projection::kGate:
      return "gate";
    case Projection::kUp:
      return "up";
    case Projection::kDown:
      return "down";
  }
  return "?";
}

}  // namespace thermocline
