module github.com/idemkit/idem

go 1.26.0
