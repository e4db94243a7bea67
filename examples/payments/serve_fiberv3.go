package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"

	"github.com/idemkit/idem/fiberv3idem"
)

// serveFiberV3 mounts the service on fiber v3 with fiberv3idem. Like fiber
// v2 it runs on fasthttp, with its own server loop, and needs the same
// server settings (see serveFiber).
func serveFiberV3(ctx context.Context, ln net.Listener, a *app) error {
	f := fiber.New(fiber.Config{
		// A connection on which no request arrives holds fasthttp's
		// graceful shutdown; the read timeout closes it, and cuts a client
		// that sends its request slowly (serveFiber).
		ReadTimeout: readTimeout,
		IdleTimeout: time.Minute,
		// Streamed, a connection holds at most 8 KiB until idem reads the
		// body, within core.WithMaxRequestBytes and readTimeout, instead of
		// a buffer sized by the declared Content-Length (serveFiber).
		StreamRequestBody: true,
	})
	idem, err := fiberv3idem.New(a.eng, fiberv3idem.WithScope(func(c fiber.Ctx) (string, error) {
		if u, _ := c.Locals("user").(string); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		return err
	}
	f.Post("/v1/payments", fiberV3RequireUser, idem, func(c fiber.Ctx) error {
		u, _ := c.Locals("user").(string)
		// c.Body() aliases fasthttp's buffer; CreatePayment does not keep it.
		status, out := a.svc.CreatePayment(c.Context(), u, c.Body())
		return fiberV3Send(c, status, out)
	})
	f.Get("/v1/payments", fiberV3RequireUser, func(c fiber.Ctx) error {
		u, _ := c.Locals("user").(string)
		status, out := a.svc.ListPayments(c.Context(), u)
		return fiberV3Send(c, status, out)
	})
	f.Get("/healthz", func(c fiber.Ctx) error {
		return fiberV3Send(c, http.StatusOK, healthBody())
	})
	if a.metrics != nil {
		f.Get("/metrics", adaptor.HTTPHandler(a.metrics))
	}
	f.Get("/openapi.json", func(c fiber.Ctx) error {
		return fiberV3Send(c, http.StatusOK, a.openapi)
	})

	errc := make(chan error, 1)
	go func() { errc <- f.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	a.log.Info("shutting down", "timeout", shutdownTimeout)
	err = f.ShutdownWithTimeout(shutdownTimeout)
	if serr := <-errc; err == nil {
		err = serr
	}
	return err
}

// fiberV3RequireUser answers 401 to a request without X-User-ID, before
// idem, and hands the user (copied out of fasthttp's buffer) to the rest
// of the chain.
func fiberV3RequireUser(c fiber.Ctx) error {
	u := c.Get(userHeader)
	if u == "" {
		status, out := unauthorized()
		return fiberV3Send(c, status, out)
	}
	c.Locals("user", strings.Clone(u))
	return c.Next()
}

func fiberV3Send(c fiber.Ctx, status int, body []byte) error {
	c.Set(fiber.HeaderContentType, contentType(status))
	return c.Status(status).Send(body)
}
