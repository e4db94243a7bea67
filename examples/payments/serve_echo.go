package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/echoidem"
)

// serveEcho mounts the service on Echo with echoidem.
func serveEcho(ctx context.Context, ln net.Listener, a *app) error {
	h, err := echoHandler(a)
	if err != nil {
		return err
	}
	return serveHTTP(ctx, ln, h, a.log)
}

func echoHandler(a *app) (http.Handler, error) {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	idem, err := echoidem.New(a.eng, echoidem.WithScope(func(c echo.Context) (string, error) {
		if u, _ := c.Get("user").(string); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		return nil, err
	}
	// Route middleware runs in order: the user check, then idem.
	e.POST("/v1/payments", func(c echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			status, out := problemJSON(http.StatusBadRequest, "unreadable-body", "Unreadable body", err.Error())
			return c.Blob(status, contentType(status), out)
		}
		u, _ := c.Get("user").(string)
		status, out := a.svc.CreatePayment(c.Request().Context(), u, body)
		return c.Blob(status, contentType(status), out)
	}, echoRequireUser, idem)
	e.GET("/v1/payments", func(c echo.Context) error {
		u, _ := c.Get("user").(string)
		status, out := a.svc.ListPayments(c.Request().Context(), u)
		return c.Blob(status, contentType(status), out)
	}, echoRequireUser)
	e.GET("/healthz", func(c echo.Context) error {
		return c.Blob(http.StatusOK, contentType(http.StatusOK), healthBody())
	})
	if a.metrics != nil {
		e.GET("/metrics", echo.WrapHandler(a.metrics))
	}
	e.GET("/openapi.json", func(c echo.Context) error {
		return c.Blob(http.StatusOK, contentType(http.StatusOK), a.openapi)
	})
	return e, nil
}

// echoRequireUser answers 401 to a request without X-User-ID, before idem,
// and hands the user to the rest of the chain.
func echoRequireUser(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		u := c.Request().Header.Get(userHeader)
		if u == "" {
			status, out := unauthorized()
			return c.Blob(status, contentType(status), out)
		}
		c.Set("user", u)
		return next(c)
	}
}
