package orm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	entdialect "entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"
	gormmysql "gorm.io/driver/mysql"
	gormpg "gorm.io/driver/postgres"
	gormsqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem/tests/orm/internal/ent"
)

// errNotTx: the negative control's conn is the *sql.DB, which has no
// transaction to end.
var errNotTx = errors.New("not a transaction")

// commitOf and rollbackOf end c as a handler holding the *sql.Tx does.
func commitOf(c conn) error {
	if tx, ok := c.(*sql.Tx); ok {
		return tx.Commit()
	}
	return errNotTx
}

func rollbackOf(c conn) error {
	if tx, ok := c.(*sql.Tx); ok {
		return tx.Rollback()
	}
	return errNotTx
}

// GORM: gorm.Open on the handler's conn (the dialector's Conn).

type gormLedger struct {
	ID int64
	K  string
}

func (gormLedger) TableName() string { return "ledger" }

type gormSession struct{ db *gorm.DB }

var gormKit = ormKit{name: "gorm", setup: func(_ *testing.T, b *backend) func(conn) (session, error) {
	return func(c conn) (session, error) {
		var d gorm.Dialector
		switch b.name {
		case "postgres":
			d = gormpg.New(gormpg.Config{Conn: c})
		case "mysql":
			d = gormmysql.New(gormmysql.Config{Conn: c, SkipInitializeWithVersion: true})
		case "sqlite":
			d = gormsqlite.Dialector{Conn: c}
		default:
			return nil, fmt.Errorf("gorm: no dialector for %s", b.name)
		}
		db, err := gorm.Open(d, &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		return gormSession{db}, err
	}
}}

func (s gormSession) book(ctx context.Context, key string) error {
	return s.db.WithContext(ctx).Create(&gormLedger{K: key}).Error
}
func (s gormSession) commit() error   { return s.db.Commit().Error }
func (s gormSession) rollback() error { return s.db.Rollback().Error }
func (s gormSession) exec(ctx context.Context, q string) error {
	return s.db.WithContext(ctx).Exec(q).Error
}

// sqlx: a *sqlx.Tx around idem's *sql.Tx (sqlx has no constructor for
// one: its driver name stays unset, so the handler binds its variables
// itself, sqlx.BindNamed and sqlx.Rebind with the database's bind type).

type sqlxLedger struct {
	ID int64  `db:"id"`
	K  string `db:"k"`
}

type sqlxConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	GetContext(ctx context.Context, dest any, query string, args ...any) error
}

type sqlxSession struct {
	x    sqlxConn
	c    conn
	bind int
}

var sqlxKit = ormKit{name: "sqlx", setup: func(_ *testing.T, b *backend) func(conn) (session, error) {
	db := sqlx.NewDb(b.db, b.driver) // the application's, opened once
	bind := sqlx.BindType(db.DriverName())
	return func(c conn) (session, error) {
		var x sqlxConn = db
		if tx, ok := c.(*sql.Tx); ok {
			x = &sqlx.Tx{Tx: tx, Mapper: db.Mapper}
		}
		return sqlxSession{x: x, c: c, bind: bind}, nil
	}
}}

func (s sqlxSession) book(ctx context.Context, key string) error {
	q, args, err := sqlx.BindNamed(s.bind, "INSERT INTO ledger (k) VALUES (:k)", sqlxLedger{K: key})
	if err != nil {
		return err
	}
	if _, err := s.x.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	// Read it back in the same transaction, into a struct.
	var got sqlxLedger
	if err := s.x.GetContext(ctx, &got, sqlx.Rebind(s.bind, "SELECT id, k FROM ledger WHERE k = ?"), key); err != nil {
		return err
	}
	if got.K != key {
		return errors.New("sqlx: read back another row")
	}
	return nil
}
func (s sqlxSession) commit() error   { return commitOf(s.c) }
func (s sqlxSession) rollback() error { return rollbackOf(s.c) }
func (s sqlxSession) exec(ctx context.Context, q string) error {
	_, err := s.x.ExecContext(ctx, q)
	return err
}

// ent: a client whose driver runs on the handler's conn (entsql.Conn).

type entSession struct {
	client *ent.Client
	drv    *entsql.Driver
	c      conn
}

var entDialects = map[string]string{"postgres": entdialect.Postgres, "mysql": entdialect.MySQL, "sqlite": entdialect.SQLite}

var entKit = ormKit{name: "ent", setup: func(_ *testing.T, b *backend) func(conn) (session, error) {
	return func(c conn) (session, error) {
		drv := entsql.NewDriver(entDialects[b.name], entsql.Conn{ExecQuerier: c})
		return entSession{client: ent.NewClient(ent.Driver(drv)), drv: drv, c: c}, nil
	}
}}

func (s entSession) book(ctx context.Context, key string) error {
	return s.client.Ledger.Create().SetK(key).Exec(ctx)
}
func (s entSession) commit() error   { return commitOf(s.c) }
func (s entSession) rollback() error { return rollbackOf(s.c) }
func (s entSession) exec(ctx context.Context, q string) error {
	return s.drv.Exec(ctx, q, []any{}, nil)
}

// bun: the application's *bun.DB, each query on the handler's conn
// (Conn).

type bunLedger struct {
	bun.BaseModel `bun:"table:ledger"`
	ID            int64  `bun:"id,pk,autoincrement"`
	K             string `bun:"k"`
}

type bunSession struct {
	db *bun.DB
	c  conn
}

var bunKit = ormKit{name: "bun", setup: func(t *testing.T, b *backend) func(conn) (session, error) {
	var d schema.Dialect
	switch b.name {
	case "postgres":
		d = pgdialect.New()
	case "mysql":
		d = mysqldialect.New()
	case "sqlite":
		d = sqlitedialect.New()
	default:
		t.Fatalf("bun: no dialect for %s", b.name)
	}
	db := bun.NewDB(b.db, d) // the application's, opened once (not closed: b.db is the test's)
	return func(c conn) (session, error) { return bunSession{db: db, c: c}, nil }
}}

func (s bunSession) book(ctx context.Context, key string) error {
	_, err := s.db.NewInsert().Conn(s.c).Model(&bunLedger{K: key}).Exec(ctx)
	return err
}
func (s bunSession) commit() error   { return commitOf(s.c) }
func (s bunSession) rollback() error { return rollbackOf(s.c) }
func (s bunSession) exec(ctx context.Context, q string) error {
	_, err := s.db.NewRaw(q).Conn(s.c).Exec(ctx)
	return err
}

func TestGORM(t *testing.T) { testORM(t, gormKit) }
func TestSQLX(t *testing.T) { testORM(t, sqlxKit) }
func TestEnt(t *testing.T)  { testORM(t, entKit) }
func TestBun(t *testing.T)  { testORM(t, bunKit) }

func TestGORMOutside(t *testing.T) { testOutside(t, gormKit) }
func TestSQLXOutside(t *testing.T) { testOutside(t, sqlxKit) }
func TestEntOutside(t *testing.T)  { testOutside(t, entKit) }
func TestBunOutside(t *testing.T)  { testOutside(t, bunKit) }
