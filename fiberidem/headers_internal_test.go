package fiberidem

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/valyala/fasthttp"
)

func sampleRequestHeader() *fasthttp.RequestHeader {
	var h fasthttp.RequestHeader
	h.SetMethod("POST")
	h.SetRequestURI("/v1/payments")
	h.SetHost("api.example.com")
	h.SetContentType("application/json")
	h.SetUserAgent("curl/8.5.0")
	h.Set("Accept", "*/*")
	h.Set("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.ZRrHA1JJJW8opsbCGfG_HACGpVUMN_a9IV7pAx_Zmeo")
	h.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	h.Add("X-Multi", "one")
	h.Add("X-Multi", "two")
	h.Set("x-lower", "v") // normalised by fasthttp
	return &h
}

func TestRequestHeaderCopy(t *testing.T) {
	h := sampleRequestHeader()
	got := requestHeader(h)
	want := http.Header{}
	for k, v := range h.All() {
		want.Add(string(k), string(v))
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	// Nothing aliases fasthttp's buffers: overwrite them and compare again.
	h.Set("Idempotency-Key", "XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX")
	h.SetHost("XXX.XXXXXXX.XXX")
	if got.Get("Idempotency-Key") != "8e03978e-40d5-43e8-bc93-6894a57f9324" || got.Get("Host") != "api.example.com" {
		t.Fatalf("copy changed with the buffers: %v", got)
	}
	if v := got.Values("X-Multi"); len(v) != 2 || v[0] != "one" || v[1] != "two" {
		t.Fatalf("X-Multi = %q", v)
	}
}

func TestRequestHeaderNotNormalised(t *testing.T) {
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	h.Set("idempotency-key", "k1")
	h.Set("x-tenant", "t")
	got := requestHeader(&h)
	if got.Get("Idempotency-Key") != "k1" || got.Get("X-Tenant") != "t" {
		t.Fatalf("names not canonicalised: %v", got)
	}
}

func TestResponseHeaderCopy(t *testing.T) {
	var h fasthttp.ResponseHeader
	h.SetContentType("application/json")
	h.Set("Location", "/v1/payments/p_1")
	h.Set("ETag", `"abc"`)
	h.SetContentLength(10)
	var ck fasthttp.Cookie
	ck.SetKey("sid")
	ck.SetValue("secret")
	h.SetCookie(&ck)
	got := responseHeader(&h)
	want := http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/v1/payments/p_1"},
		"Etag":         {`"abc"`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

func BenchmarkRequestHeader(b *testing.B) {
	h := sampleRequestHeader()
	b.ReportAllocs()
	for b.Loop() {
		_ = requestHeader(h)
	}
}

func BenchmarkResponseHeader(b *testing.B) {
	var h fasthttp.ResponseHeader
	h.SetContentType("application/json")
	h.Set("Location", "/v1/payments/p_1")
	b.ReportAllocs()
	for b.Loop() {
		_ = responseHeader(&h)
	}
}
