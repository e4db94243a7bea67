package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"

	"github.com/idemkit/idem/fiberidem"
)

// serveFiber mounts the service on fiber with fiberidem. fiber runs on
// fasthttp, not net/http, so it has its own server loop.
func serveFiber(ctx context.Context, ln net.Listener, a *app) error {
	f := fiber.New(fiber.Config{
		DisableStartupMessage: true,
		// fasthttp counts a connection on which no request has arrived yet
		// as busy, and its graceful shutdown waits for it: a client that
		// opened a connection and never used it (Go's transport dials
		// spares) would hold SIGTERM for the whole shutdown timeout. The
		// read timeout closes such a connection, and cuts a client that
		// sends its request slowly. Keep-alive connections may idle longer.
		ReadTimeout: readTimeout,
		IdleTimeout: time.Minute,
		// fasthttp otherwise reads the whole body, sized by the declared
		// Content-Length (up to BodyLimit, 4 MiB), before any handler runs:
		// 500 connections that declare 4 MB and trickle a byte took 2 GB.
		// Streamed, a connection holds at most 8 KiB until idem reads the
		// body, within core.WithMaxRequestBytes and readTimeout.
		StreamRequestBody: true,
	})
	idem, err := fiberidem.New(a.eng, fiberidem.WithScope(func(c *fiber.Ctx) (string, error) {
		if u, _ := c.Locals("user").(string); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		return err
	}
	f.Post("/v1/payments", fiberRequireUser, idem, func(c *fiber.Ctx) error {
		u, _ := c.Locals("user").(string)
		// c.Body() aliases fasthttp's buffer; CreatePayment does not keep it.
		status, out := a.svc.CreatePayment(c.UserContext(), u, c.Body())
		return fiberSend(c, status, out)
	})
	f.Get("/v1/payments", fiberRequireUser, func(c *fiber.Ctx) error {
		u, _ := c.Locals("user").(string)
		status, out := a.svc.ListPayments(c.UserContext(), u)
		return fiberSend(c, status, out)
	})
	f.Get("/healthz", func(c *fiber.Ctx) error {
		return fiberSend(c, http.StatusOK, healthBody())
	})
	if a.metrics != nil {
		f.Get("/metrics", adaptor.HTTPHandler(a.metrics))
	}
	f.Get("/openapi.json", func(c *fiber.Ctx) error {
		return fiberSend(c, http.StatusOK, a.openapi)
	})

	errc := make(chan error, 1)
	go func() { errc <- f.Listener(ln) }()
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

// fiberRequireUser answers 401 to a request without X-User-ID, before idem,
// and hands the user (copied out of fasthttp's buffer) to the rest of the
// chain.
func fiberRequireUser(c *fiber.Ctx) error {
	u := c.Get(userHeader)
	if u == "" {
		status, out := unauthorized()
		return fiberSend(c, status, out)
	}
	c.Locals("user", strings.Clone(u))
	return c.Next()
}

func fiberSend(c *fiber.Ctx, status int, body []byte) error {
	c.Set(fiber.HeaderContentType, contentType(status))
	return c.Status(status).Send(body)
}
