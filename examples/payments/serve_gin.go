package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/ginidem"
)

// serveGin mounts the service on gin with ginidem.
func serveGin(ctx context.Context, ln net.Listener, a *app) error {
	h, err := ginHandler(a)
	if err != nil {
		return err
	}
	return serveHTTP(ctx, ln, h, a.log)
}

func ginHandler(a *app) (http.Handler, error) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	idem, err := ginidem.New(a.eng, ginidem.WithScope(func(c *gin.Context) (string, error) {
		if u := c.GetString("user"); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		return nil, err
	}
	r.POST("/v1/payments", ginRequireUser, idem, func(c *gin.Context) {
		body, err := io.ReadAll(c.Request.Body)
		if err != nil {
			status, out := problemJSON(http.StatusBadRequest, "unreadable-body", "Unreadable body", err.Error())
			c.Data(status, contentType(status), out)
			return
		}
		status, out := a.svc.CreatePayment(c.Request.Context(), c.GetString("user"), body)
		c.Data(status, contentType(status), out)
	})
	r.GET("/v1/payments", ginRequireUser, func(c *gin.Context) {
		status, out := a.svc.ListPayments(c.Request.Context(), c.GetString("user"))
		c.Data(status, contentType(status), out)
	})
	r.GET("/healthz", func(c *gin.Context) {
		c.Data(http.StatusOK, contentType(http.StatusOK), healthBody())
	})
	if a.metrics != nil {
		r.GET("/metrics", gin.WrapH(a.metrics))
	}
	r.GET("/openapi.json", func(c *gin.Context) {
		c.Data(http.StatusOK, contentType(http.StatusOK), a.openapi)
	})
	return r, nil
}

// ginRequireUser answers 401 to a request without X-User-ID, before idem,
// and hands the user to the rest of the chain.
func ginRequireUser(c *gin.Context) {
	u := c.GetHeader(userHeader)
	if u == "" {
		status, out := unauthorized()
		c.Data(status, contentType(status), out)
		c.Abort()
		return
	}
	c.Set("user", u)
}
