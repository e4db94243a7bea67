package adapterkit

import "testing"

func TestCanonicalRoute(t *testing.T) {
	cases := map[string]string{
		"/v1/payments":                     "/v1/payments",
		"POST /v1/payments":                "/v1/payments",
		"POST api.example.com/v1/payments": "/v1/payments",
		"/v1/orders/{id}/confirm":          "/v1/orders/{id}/confirm",
		"POST /v1/orders/{id}/confirm":     "/v1/orders/{id}/confirm",
		"/v1/orders/:id/confirm":           "/v1/orders/{id}/confirm",
		"/v1/orders/:id<int>/confirm":      "/v1/orders/{id}/confirm",
		"/v1/orders/:id?":                  "/v1/orders/{id}",
		"/v1/orders/{id:[0-9]+}/confirm":   "/v1/orders/{id}/confirm",
		"/v1/orders/{id:[0-9]{3}}/confirm": "/v1/orders/{id}/confirm",
		"/files/*path":                     "/files/{*}",
		"/files/*":                         "/files/{*}",
		"/files/{path...}":                 "/files/{*}",
		"POST /files/{$}":                  "/files/",
		"/v1/things\\:batch":               "/v1/things\\:batch",
		"/flights/:from-:to":               "/flights/{from}-{to}",
		"":                                 "",
		"/a b":                             "/a b",
	}
	for in, want := range cases {
		if got := CanonicalRoute(in); got != want {
			t.Errorf("CanonicalRoute(%q) = %q, want %q", in, got, want)
		}
		if got := CanonicalRoute(want); got != want {
			t.Errorf("CanonicalRoute(%q) (already canonical) = %q", want, got)
		}
	}
}
