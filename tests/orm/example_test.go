package orm_test

import (
	"context"
	"net/http"
	"os"

	entdialect "entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/nethttpidem"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/tests/orm/internal/ent"
)

// serve wires a payments handler behind idem on PostgreSQL, as a service
// does at start-up, and returns the pool (the ORMs' *sql.DB comes from it).
func serve(ctx context.Context, pay http.HandlerFunc) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, err
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	store, err := pgstore.New(pool)
	if err != nil {
		return nil, err
	}
	eng, err := core.New(store)
	if err != nil {
		return nil, err
	}
	mw, err := nethttpidem.New(eng)
	if err != nil {
		return nil, err
	}
	http.Handle("POST /v1/payments", mw(pay))
	return pool, nil
}

// Payment is the business row, mapped for GORM and bun.
type Payment struct {
	bun.BaseModel `bun:"table:payments" gorm:"-"`
	ID            int64 `bun:"id,pk,autoincrement"`
	Amount        int64 `bun:"amount"`
}

// A handler written with GORM: the dialector's Conn is idem's transaction
// (on MySQL: mysqlstore.Tx and gorm.io/driver/mysql's Config{Conn: tx,
// SkipInitializeWithVersion: true}; on SQLite: sqlitestore.Tx and
// gorm.io/driver/sqlite's Dialector{Conn: tx}).
func Example_gorm() {
	pay := func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgstore.SQLTx(r.Context()) // idem's transaction: do not Commit it
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: tx}), &gorm.Config{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := db.WithContext(r.Context()).Create(&Payment{Amount: 1000}).Error; err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // idem rolls the row back
			return
		}
		w.WriteHeader(http.StatusCreated) // the row commits with this stored 201
	}
	_, _ = serve(context.Background(), pay)
}

// A handler written with sqlx: a *sqlx.Tx around idem's transaction. sqlx
// has no constructor for one, so its driver name stays unset: write the
// database's own bind variables ($1 on PostgreSQL), or bind named queries
// with sqlx.BindNamed(sqlx.BindType(db.DriverName()), …).
func Example_sqlx() {
	var db *sqlx.DB // the application's, opened once below
	pay := func(w http.ResponseWriter, r *http.Request) {
		sqlTx, err := pgstore.SQLTx(r.Context()) // mysqlstore.Tx, sqlitestore.Tx on the other stores
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		tx := &sqlx.Tx{Tx: sqlTx, Mapper: db.Mapper}
		var id int64
		if err := tx.GetContext(r.Context(), &id, "INSERT INTO payments (amount) VALUES ($1) RETURNING id", 1000); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	pool, err := serve(context.Background(), pay)
	if err != nil {
		return
	}
	db = sqlx.NewDb(stdlib.OpenDBFromPool(pool), "pgx")
}

// A handler written with ent: a client whose driver runs on idem's
// transaction (entsql.Conn). Do not call the client's Tx: the transaction
// is idem's.
func Example_ent() {
	pay := func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgstore.SQLTx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		client := ent.NewClient(ent.Driver(entsql.NewDriver(entdialect.Postgres, entsql.Conn{ExecQuerier: tx})))
		if err := client.Ledger.Create().SetK("payment").Exec(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	_, _ = serve(context.Background(), pay)
}

// A handler written with bun: the application's *bun.DB, each query run on
// idem's transaction with Conn.
func Example_bun() {
	var db *bun.DB // the application's, opened once below
	pay := func(w http.ResponseWriter, r *http.Request) {
		tx, err := pgstore.SQLTx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := db.NewInsert().Conn(tx).Model(&Payment{Amount: 1000}).Exec(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
	pool, err := serve(context.Background(), pay)
	if err != nil {
		return
	}
	db = bun.NewDB(stdlib.OpenDBFromPool(pool), pgdialect.New())
}
