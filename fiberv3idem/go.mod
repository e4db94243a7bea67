module github.com/idemkit/idem/fiberv3idem

go 1.25.0

replace github.com/idemkit/idem => ..

require (
	github.com/andybalholm/brotli v1.2.0
	github.com/gofiber/fiber/v3 v3.1.0
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/klauspost/compress v1.18.4
	github.com/stretchr/testify v1.12.1
	github.com/valyala/fasthttp v1.69.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/gofiber/schema v1.7.0 // indirect
	github.com/gofiber/utils/v2 v2.0.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/tinylib/msgp v1.6.3 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/net v0.50.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/text v0.34.0 // indirect
)
