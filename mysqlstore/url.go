package mysqlstore

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ParseURL turns a URL of the form
//
//	mysql://user:password@host[:port]/database[?param=value&...]
//
// (port 3306 by default; the query holds go-sql-driver DSN parameters)
// into the driver's configuration, for programs that take one -dsn flag
// for PostgreSQL and MySQL alike (examples/payments, examples/loadgen).
// Errors never repeat the password. The driver's own DSN syntax
// (user:password@tcp(host:port)/database) is parsed by mysql.ParseDSN.
func ParseURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "mysql" {
		return nil, errors.New("mysqlstore: not a mysql://user:pass@host:port/db URL")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host == "" || db == "" || strings.Contains(db, "/") {
		return nil, errors.New("mysqlstore: want mysql://user:pass@host:port/db (host and database required)")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	cfg := mysql.NewConfig()
	if u.RawQuery != "" {
		// Let the driver interpret its own parameters: parse them as a DSN.
		parsed, err := mysql.ParseDSN("/" + url.PathEscape(db) + "?" + u.RawQuery)
		if err != nil {
			return nil, fmt.Errorf("mysqlstore: URL parameters: %w", err)
		}
		cfg = parsed
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort(host, port)
	cfg.DBName = db
	return cfg, nil
}
