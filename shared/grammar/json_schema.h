// JSON Schema -> GBNF (gbnf.h), for response_format json_schema / json_object
// (docs/gateway.md#structured-output).
//
// Supported: type (one or a list) object / array / string / number / integer / boolean / null;
// properties in their given order, required (optional properties may be left out, each at its
// place in that order), additionalProperties false / true / absent (no extra properties are
// generated) or a schema when there are no properties (a map); items, minItems, maxItems;
// minLength, maxLength; enum and const (any JSON values); anyOf and oneOf (as alternatives:
// oneOf's branches are not made exclusive, so overlapping branches can yield a value that
// matches two); $ref to #, #/$defs/NAME or #/definitions/NAME (recursion included); `{}` /
// true (any value). Annotations (title, description, default, examples, $schema, $id,
// $comment) are ignored, as are keywords JSON Schema does not define.
// Refused, naming the keyword and its JSON path ("pattern at $.properties.name is not
// supported"): pattern, format, numeric bounds, allOf, not, if/then/else, prefixItems,
// uniqueItems, patternProperties, and the rest listed in json_schema.cc.
//
// Whitespace: the output is compact JSON with at most one space after each ':' and ','
// (`{"a": 1,"b":2}`), none elsewhere; integers have at most 16 digits, fractions at most 16,
// exponents at most 3, so that a number always ends.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace thermocline::grammar {

// The schema (JSON text) as GBNF text; INVALID_ARGUMENT naming the construct and its path.
absl::StatusOr<std::string> JsonSchemaToGbnf(std::string_view schema_json);
// Any JSON object (response_format json_object), same whitespace policy.
std::string JsonObjectGbnf();

}  // namespace thermocline::grammar
