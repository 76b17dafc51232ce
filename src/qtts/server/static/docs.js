// The API reference at /docs: /openapi.json rendered as plain HTML (no framework, no CDN).
"use strict";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function resolve(schema, spec) {
  // follow one "$ref": "#/components/schemas/Name"
  if (schema && schema.$ref) {
    const name = schema.$ref.split("/").pop();
    return (spec.components && spec.components.schemas && spec.components.schemas[name]) || {};
  }
  return schema || {};
}

function typeOf(prop, spec) {
  const p = resolve(prop, spec);
  if (p.enum) return p.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (p.anyOf) return p.anyOf.map((s) => typeOf(s, spec)).filter((t) => t !== "null").join(" | ");
  if (prop.$ref) return prop.$ref.split("/").pop();
  return p.type || "object";
}

function fieldsTable(schema, spec) {
  const s = resolve(schema, spec);
  const props = s.properties || {};
  const names = Object.keys(props);
  if (!names.length) return null;
  const required = new Set(s.required || []);
  const table = el("table", "fields");
  for (const name of names) {
    const prop = props[name];
    const row = el("tr");
    row.append(el("td", "name", name + (required.has(name) ? " *" : "")), el("td", "type", typeOf(prop, spec)),
      el("td", "desc", resolve(prop, spec).description || prop.description || ""));
    table.append(row);
  }
  return table;
}

function operation(path, method, op, spec) {
  const card = el("section", "card route");
  const head = el("h2");
  head.append(el("span", "method", method.toUpperCase()), document.createTextNode(" " + path));
  card.append(head);
  if (op.summary) card.append(el("p", "summary", op.summary));
  if (op.description) card.append(el("p", "muted", op.description));
  const body = op.requestBody && op.requestBody.content;
  if (body) {
    for (const [media, content] of Object.entries(body)) {
      card.append(el("p", "muted", "Request body (" + media + "):"));
      const table = fieldsTable(content.schema, spec);
      if (table) card.append(table);
    }
  }
  const statuses = Object.keys(op.responses || {});
  if (statuses.length) card.append(el("p", "muted", "Responses: " + statuses.join(", ")));
  return card;
}

async function main() {
  const title = document.getElementById("title");
  const routes = document.getElementById("routes");
  try {
    const resp = await fetch("openapi.json");
    const spec = await resp.json();
    title.textContent = spec.info.title + " " + spec.info.version + ": " + (spec.info.description || "");
    for (const [path, methods] of Object.entries(spec.paths)) {
      for (const [method, op] of Object.entries(methods)) routes.append(operation(path, method, op, spec));
    }
    window.qttsDocs = { routes: routes.children.length };
  } catch (err) {
    title.textContent = "could not read /openapi.json: " + err;
    window.qttsDocs = { error: String(err) };
  }
}

main();
