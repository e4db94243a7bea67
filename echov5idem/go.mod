module github.com/idemkit/idem/echov5idem

go 1.25.0

replace github.com/idemkit/idem => ..

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/labstack/echo/v5 v5.4.6
)
