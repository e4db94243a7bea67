module github.com/idemkit/idem/echov5idem

// echo v5 needs go 1.25.0: lower this to 1.25.0 once the root module's go
// line is (a dependency's go line is a floor).
go 1.26.0

require (
	github.com/idemkit/idem v0.0.0
	github.com/labstack/echo/v5 v5.4.6
	go.uber.org/goleak v1.3.0
)

require golang.org/x/time v0.15.0 // indirect

replace github.com/idemkit/idem => ../
