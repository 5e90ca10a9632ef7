// The API's OpenAPI document in Swagger UI (docs.html): its assets are the service's own
// (/static/swagger/, from the fastapi-offline package), no inline script (the CSP forbids it),
// no online validator (validator.swagger.io). A token goes in through "Authorize".
/* global SwaggerUIBundle */
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
  validatorUrl: null,
});
