package grpcidem

import "context"

// Option configures UnaryServerInterceptor.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	scope func(ctx context.Context) (string, error)
	// replayed: the engine's replayed header, as metadata (lower case).
	replayed string
	methods  map[string]bool
}

// WithScope sets the function naming the tenant whose key space a call's
// key belongs to, from the call's context (the authenticated peer, a
// token's subject); an error refuses the call with codes.Unauthenticated.
// Default: none, which UnaryServerInterceptor refuses unless the engine
// shares one key space (core.WithSharedKeySpace).
func WithScope(f func(ctx context.Context) (string, error)) Option {
	return optionFunc(func(c *config) { c.scope = f })
}

// WithMethods names the unary methods to protect, by full name
// ("/payments.v1.Payments/Charge"); calls of other methods pass through.
// Repeatable. Default: none (the interceptor protects nothing until told).
func WithMethods(fullMethods ...string) Option {
	return optionFunc(func(c *config) {
		if c.methods == nil {
			c.methods = make(map[string]bool, len(fullMethods))
		}
		for _, m := range fullMethods {
			c.methods[m] = true
		}
	})
}

// ClientOption configures UnaryClientInterceptor.
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	newKey  func() string
	methods map[string]bool
}

// WithKeyFunc sets how the client interceptor makes a key for a call that
// has none. Default: 128 random bits, hex-encoded.
func WithKeyFunc(f func() string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		if f != nil {
			c.newKey = f
		}
	})
}

// WithClientMethods names the methods the client interceptor gives a key,
// by full name. Repeatable. Default: every unary method.
func WithClientMethods(fullMethods ...string) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		if c.methods == nil {
			c.methods = make(map[string]bool, len(fullMethods))
		}
		for _, m := range fullMethods {
			c.methods[m] = true
		}
	})
}
