package main

import (
	"encoding/json"
	"net/http"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/openapi"
)

// apiDocument describes the whole API as OpenAPI 3.1, with the idempotency
// policy of eng — the engine the server actually runs — merged in: the key
// header and its format, which methods need it, retention and lease, the
// Idempotent-Replayed header on replayable responses and every problem
// response idem can answer. GET /openapi.json serves it.
func apiDocument(eng *core.Engine, metrics bool) map[string]any {
	ref := func(kind, name string) map[string]any {
		return map[string]any{"$ref": "#/components/" + kind + "/" + name}
	}
	jsonBody := func(desc string, schema any) map[string]any {
		return map[string]any{"description": desc, "content": map[string]any{"application/json": map[string]any{"schema": schema}}}
	}
	problemBody := func(desc string) map[string]any {
		return map[string]any{"description": desc, "content": map[string]any{
			"application/problem+json": map[string]any{"schema": ref("schemas", "Problem")}}}
	}
	user := ref("parameters", "UserID")

	create := map[string]any{
		"operationId": "createPayment",
		"summary":     "Charge the provider and book a payment, at most once per (user, idempotency key).",
		"parameters":  []any{user},
		"requestBody": map[string]any{"required": true, "content": map[string]any{
			"application/json": map[string]any{"schema": ref("schemas", "PaymentRequest")}}},
		"responses": map[string]any{
			"201": jsonBody("The payment, booked.", ref("schemas", "Payment")),
			"400": problemBody("The body is not a valid payment (" + problemBase + "invalid-payment); final: retries get it replayed."),
			"401": problemBody("The " + userHeader + " header is missing (" + problemBase + "unauthenticated)."),
			"500": problemBody("The ledger could not be written; retry with the same key."),
			"502": problemBody("The payment provider did not confirm the charge; retry with the same key."),
		},
	}
	frag := openapi.New(eng.Policy())
	frag.Protect(http.MethodPost, create)

	list := map[string]any{
		"operationId": "listPayments",
		"summary":     "The user's payments, oldest first.",
		"parameters":  []any{user},
		"responses": map[string]any{
			"200": jsonBody("The user's ledger rows.", map[string]any{"type": "array", "items": ref("schemas", "Payment")}),
			"401": problemBody("The " + userHeader + " header is missing."),
			"500": problemBody("The ledger could not be read."),
		},
	}
	frag.Protect(http.MethodGet, list) // GET is never protected: a no-op, kept to show the rule

	paths := map[string]any{
		"/v1/payments": map[string]any{"post": create, "get": list},
		"/healthz": map[string]any{"get": map[string]any{
			"operationId": "health",
			"responses": map[string]any{"200": jsonBody("Serving.", map[string]any{
				"type": "object", "properties": map[string]any{"status": map[string]any{"const": "ok"}}})},
		}},
		"/openapi.json": map[string]any{"get": map[string]any{
			"operationId": "openapi",
			"summary":     "This document.",
			"responses":   map[string]any{"200": jsonBody("OpenAPI 3.1 description of this API.", map[string]any{"type": "object"})},
		}},
	}
	if metrics {
		paths["/metrics"] = map[string]any{"get": map[string]any{
			"operationId": "metrics",
			"summary":     "OpenTelemetry metrics in the Prometheus text format (-metrics).",
			"responses": map[string]any{"200": map[string]any{"description": "Prometheus exposition.",
				"content": map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}}},
		}}
	}

	doc := map[string]any{
		"openapi":           "3.1.0",
		"jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
		"info": map[string]any{
			"title":   "idem payments example",
			"version": "1.0.0",
			"description": "A payments API protected by idem. POST /v1/payments runs at most once per (" + userHeader +
				", Idempotency-Key); see the Idempotency-Key parameter and x-idempotency for the policy in force.",
		},
		"paths": paths,
		"components": map[string]any{
			"parameters": map[string]any{"UserID": map[string]any{
				"name": userHeader, "in": "header", "required": true,
				"description": "The caller (demo authentication); also the tenant idempotency keys are scoped to.",
				"schema":      map[string]any{"type": "string", "minLength": 1},
			}},
			"schemas": map[string]any{
				"PaymentRequest": map[string]any{
					"type":     "object",
					"required": []any{"amount", "currency", "to"},
					"properties": map[string]any{
						"amount":   map[string]any{"type": "integer", "minimum": 1, "maximum": maxAmount},
						"currency": map[string]any{"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code"},
						"to":       map[string]any{"type": "string", "minLength": 1, "maxLength": 200},
					},
				},
				"Payment": map[string]any{
					"type":     "object",
					"required": []any{"id", "amount", "currency", "to", "provider_charge_id"},
					"properties": map[string]any{
						"id":                 map[string]any{"type": "string"},
						"amount":             map[string]any{"type": "integer", "minimum": 1},
						"currency":           map[string]any{"type": "string"},
						"to":                 map[string]any{"type": "string"},
						"provider_charge_id": map[string]any{"type": "string"},
					},
				},
				"Problem": map[string]any{
					"type":        "object",
					"description": "RFC 9457 problem details.",
					"required":    []any{"type", "title", "status"},
					"properties": map[string]any{
						"type":   map[string]any{"type": "string", "format": "uri"},
						"title":  map[string]any{"type": "string"},
						"status": map[string]any{"type": "integer"},
						"detail": map[string]any{"type": "string"},
					},
				},
			},
		},
	}
	frag.AddTo(doc)
	return doc
}

// openAPIJSON renders apiDocument once, at start.
func openAPIJSON(eng *core.Engine, metrics bool) ([]byte, error) {
	return json.MarshalIndent(apiDocument(eng, metrics), "", "  ")
}
