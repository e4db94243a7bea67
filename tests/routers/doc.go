// Package routers tests nethttpidem behind the routers people use with
// net/http: chi (github.com/go-chi/chi/v5) here, in a module of its own so
// chi stays out of the root module. Go 1.22+ http.ServeMux patterns are
// tested in nethttpidem itself (standard library only).
package routers
