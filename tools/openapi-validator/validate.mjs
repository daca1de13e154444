// Validates an OpenAPI document with @apidevtools/swagger-parser, the
// validator many client generators run first: the Swagger 2.0 JSON schema,
// then its semantic checks ($refs resolve, path parameters declared, unique
// operation ids, ...). Prints "valid: <title> <version>" or the errors, and
// exits 1 on an invalid document.
//
//   node validate.mjs FILE
import SwaggerParser from "@apidevtools/swagger-parser";

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs FILE");
  process.exit(2);
}
try {
  const api = await SwaggerParser.validate(file);
  console.log(`valid: ${api.info.title} ${api.info.version}`);
} catch (err) {
  console.error(err.message);
  process.exit(1);
}
