module github.com/idemkit/idem/echov5idem

go 1.25.0

replace github.com/idemkit/idem => ..

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/labstack/echo/v5 v5.4.6
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/time v0.15.0 // indirect
)
