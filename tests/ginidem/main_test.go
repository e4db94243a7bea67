package ginidem_test

import (
	"os"
	"testing"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
	os.Exit(0) // unreachable: VerifyTestMain exits
}
